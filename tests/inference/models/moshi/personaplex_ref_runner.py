"""Runs INSIDE .venv-personaplex-ref (NVIDIA/personaplex 3428dfd, package ``moshi-personaplex``, NO_TORCH_COMPILE=1):
the reference side of the PersonaPlex parity tests.

Builds the reference ``LMModel`` and ``MimiModel`` from a Parley checkpoint directory (``config.json`` LM kwargs,
``mimi_config.json``), loads their safetensors strictly, and runs each requested session the way the reference's
offline runner and server do (greedy): load the voice prompt, reset all streaming state, ``step_system_prompts``
(voice prompt, silence, persona, silence), reset Mimi, then one ``LMGen.step`` per user-code column. The model
warm-up is left out: the golden pack's README shows it changes nothing.

    python personaplex_ref_runner.py JOB.json

JOB.json: ``{"ckpt": DIR, "sessions": [{"voice": PATH|null, "persona": TEXT, "user_codes": NPY, "out": NPY,
"voice_pt_out": PATH|null, "voice_codes_out": PATH|null}, ...], "mimi_encode": [{"audio": PATH, "out": NPY}]}``. Each ``out`` gets int64 ``[T, 17]``: what live step ``t`` returned. For a
``.wav`` voice, ``voice_pt_out`` receives the ``.pt`` voice prompt the reference saves while replaying it, and
``voice_codes_out`` the reference Mimi's codes of the wav, int64 ``[8, F]``. Each ``mimi_encode`` item gets the
reference Mimi's codes of a user recording (no loudness change), int64 ``[8, F]``. Each optional ``voice_codes``
item (``{"voice": WAV, "out": NPY}``) gets the reference Mimi's codes of a voice wav as ``load_voice_prompt``
prepares it (sphn read + resample, pyloudnorm -24 LUFS), int64 ``[8, F]``.
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import sentencepiece
import torch
from moshi.models.compression import MimiModel
from moshi.models.lm import LMGen, LMModel, _iterate_audio, encode_from_sphn, load_audio
from moshi.modules import SEANetDecoder, SEANetEncoder
from moshi.modules.transformer import ProjectedTransformer
from moshi.offline import wrap_with_system_tags
from moshi.quantization import SplitResidualVectorQuantizer
from safetensors.torch import load_file, load_model

NON_LM_KEYS = (
    "moshi_name",
    "mimi_name",
    "mimi_config_name",
    "tokenizer_name",
    "lora_name",
    "model_type",
    "lm_gen_config",
    "tts_config",
    "stt_config",
    "model_id",
    "parley_demo",
)


def load_lm(ckpt: Path) -> LMModel:
    kwargs = json.loads((ckpt / "config.json").read_text())
    for key in NON_LM_KEYS:
        kwargs.pop(key, None)
    lm = LMModel(device="cpu", dtype=torch.float32, **kwargs)
    lm.load_state_dict(load_file(str(ckpt / "model.safetensors")), strict=True)
    return lm.eval()


def load_mimi(ckpt: Path) -> MimiModel:
    """The reference's ``loaders.get_mimi`` with the widths of the checkpoint's ``mimi_config.json``."""
    cfg = json.loads((ckpt / "mimi_config.json").read_text())
    encoder = SEANetEncoder(**cfg["seanet"])
    decoder = SEANetDecoder(**cfg["seanet"])
    quantizer = SplitResidualVectorQuantizer(**cfg["quantizer"])
    mimi = MimiModel(
        encoder,
        decoder,
        quantizer,
        channels=cfg["channels"],
        sample_rate=cfg["sample_rate"],
        frame_rate=cfg["frame_rate"],
        encoder_frame_rate=cfg["sample_rate"] / encoder.hop_length,
        causal=True,
        resample_method="conv",
        encoder_transformer=ProjectedTransformer(device="cpu", **cfg["transformer"]),
        decoder_transformer=ProjectedTransformer(device="cpu", **cfg["transformer"]),
    )
    mimi.eval()
    load_model(mimi, str(ckpt / "mimi.safetensors"))
    mimi.set_num_codebooks(8)
    return mimi


def run_session(lm_gen: LMGen, mimi: MimiModel, tokenizer, session: dict) -> None:
    voice = session.get("voice")
    with tempfile.TemporaryDirectory() as tmp:
        if voice is not None and voice.endswith(".pt"):
            lm_gen.load_voice_prompt_embeddings(voice)
        elif voice is not None:
            # the reference writes the .pt next to the wav: work on a private copy
            voice = shutil.copy(voice, Path(tmp) / "voice.wav")
            lm_gen.load_voice_prompt(voice)
        else:  # no voice prompt: forget the previous session's
            lm_gen.voice_prompt_embeddings = lm_gen.voice_prompt_audio = None
        if session.get("voice_codes_out"):  # the reference's Mimi codes of the (normalised) voice wav
            mimi.reset_streaming()
            codes = torch.cat(list(lm_gen._encode_voice_prompt_frames(mimi)), dim=-1)[0]
            np.save(session["voice_codes_out"], codes.numpy().astype(np.int64))
        lm_gen.save_voice_prompt_embeddings = bool(session.get("voice_pt_out"))
        lm_gen.text_prompt_tokens = tokenizer.encode(wrap_with_system_tags(session["persona"]))
        mimi.reset_streaming()
        lm_gen.reset_streaming()
        lm_gen.step_system_prompts(mimi)
        mimi.reset_streaming()
        if session.get("voice_pt_out"):
            shutil.copy(Path(tmp) / "voice.pt", session["voice_pt_out"])
    codes = torch.from_numpy(np.load(session["user_codes"])).long()
    rows = []
    for t in range(codes.shape[1]):
        out = lm_gen.step(input_tokens=codes[None, :, t : t + 1])
        rows.append(out[0, :, 0].numpy())
    np.save(session["out"], np.stack(rows).astype(np.int64))


def encode_user_audio(lm_gen: LMGen, mimi: MimiModel, item: dict) -> None:
    """A user recording through a fresh Mimi stream, frame by frame, as the reference's offline runner does."""
    mimi.reset_streaming()
    audio = load_audio(item["audio"], mimi.sample_rate)
    frames = _iterate_audio(audio, sample_interval_size=lm_gen._frame_size, pad=True)
    codes = torch.cat(list(encode_from_sphn(mimi, frames, max_batch=1)), dim=-1)[0]
    np.save(item["out"], codes.numpy().astype(np.int64))


def encode_voice_wav(lm_gen: LMGen, mimi: MimiModel, item: dict) -> None:
    """A voice wav prepared by the reference's own ``load_voice_prompt``, through a fresh Mimi stream."""
    with tempfile.TemporaryDirectory() as tmp:
        lm_gen.load_voice_prompt(shutil.copy(item["voice"], Path(tmp) / "voice.wav"))
        mimi.reset_streaming()
        codes = torch.cat(list(lm_gen._encode_voice_prompt_frames(mimi)), dim=-1)[0]
    np.save(item["out"], codes.numpy().astype(np.int64))


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    ckpt = Path(job["ckpt"])
    torch.manual_seed(0)
    lm, mimi = load_lm(ckpt), load_mimi(ckpt)
    tokenizer = sentencepiece.SentencePieceProcessor(str(ckpt / "tokenizer.model"))
    lm_gen = LMGen(
        lm,
        device="cpu",
        use_sampling=False,
        audio_silence_frame_cnt=int(0.5 * mimi.frame_rate),
        sample_rate=mimi.sample_rate,
        frame_rate=mimi.frame_rate,
    )
    mimi.streaming_forever(1)
    lm_gen.streaming_forever(1)
    with torch.no_grad():
        for session in job["sessions"]:
            run_session(lm_gen, mimi, tokenizer, session)
        for item in job.get("mimi_encode", []):
            encode_user_audio(lm_gen, mimi, item)
        for item in job.get("voice_codes", []):
            encode_voice_wav(lm_gen, mimi, item)


if __name__ == "__main__":
    main()
