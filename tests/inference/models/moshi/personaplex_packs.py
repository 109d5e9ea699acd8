"""PersonaPlex sessions that outlive the attention context: the tiny shapes, their checkpoints, both sides' runs.

A *pack* is one tiny random PersonaPlex checkpoint plus a few sessions on it (voice prompt kind, persona, user
codes). Its weights are regenerated here from seeds by ``make_checkpoint``'s generators, whose noise is the same
on every CPU (``seeded.unit_noise``); ``packs.json`` pins their sha256, so a changed generator fails loudly
instead of as a token mismatch. What is stored under
``tests/data/personaplex_wrap`` is only what the reference produced: its ``.pt`` voice prompt (made from
``voice.wav``), its Mimi codes of that wav and of ``user.flac``, and its tokens for every live step of every
session.

``make_personaplex_wrap_goldens.py`` writes the packs; ``test_personaplex_wrap.py`` checks them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
from safetensors.torch import save_file

from inference.models.moshi.config import CheckpointInfo, read_checkpoint_dir
from inference.models.moshi.gen import LockstepGen, SamplingConfig
from inference.models.moshi.loading import load_lm
from inference.models.moshi.make_checkpoint import PRESETS, write_lm_checkpoint
from inference.models.moshi.mimi_config import MimiConfig
from inference.models.moshi.mimi_loading import load_mimi, random_mimi_state_dict
from inference.models.moshi.personaplex import (
    build_prefill,
    load_voice_prompt,
    persona_tokens,
    stream_encode,
    voice_frames_from_codes,
    voice_frames_from_prompt,
)
from inference.models.moshi.replay import live_steps, run_prefill
from tests.inference.models.moshi.moshi_lm_helpers import PERSONAPLEX_DATA, ROOT

DATA = ROOT / "tests" / "data" / "personaplex_wrap"
VOICE_WAV = DATA / "voice.wav"
USER_AUDIO = DATA / "user.flac"  # 6 s of speech: 150 Mimi transformer steps, past a small Mimi's context
TOKENIZER = PERSONAPLEX_DATA / "ckpt" / "tokenizer.model"  # 256 pieces; every pack's text_card is >= 256
REF_PYTHON = ROOT / ".venv-personaplex-ref" / "bin" / "python"
REF_RUNNER = Path(__file__).with_name("personaplex_ref_runner.py")
REFERENCE = "NVIDIA/personaplex 3428dfd95309a7f3c84fd93259ded0f810d1ff91 (package moshi-personaplex 0.1.0)"
VOICE_KINDS = ("pt", "safetensors", "wav")


@dataclass
class Pack:
    """One shape: its spec (from ``packs.json``), checkpoint directory and the voice prompt in every form."""

    name: str
    spec: dict
    ckpt: Path
    voices: dict[str, Path]  # kind -> file

    @property
    def info(self) -> CheckpointInfo:
        return read_checkpoint_dir(self.ckpt)

    @property
    def dir(self) -> Path:
        return DATA / self.name


def load_specs() -> dict[str, dict]:
    return json.loads((DATA / "packs.json").read_text())["packs"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_checkpoint(spec: dict, out: Path) -> Path:
    """The pack's checkpoint directory: LM and Mimi weights from their seeds, the shared tiny tokenizer."""
    write_lm_checkpoint(out, dict(PRESETS["tiny-personaplex"], **spec["lm"]), spec["lm_seed"])
    mimi = MimiConfig.tiny().to_dict()
    for section, values in spec["mimi"].items():
        mimi[section].update(values)
    mimi_config = MimiConfig.from_dict(mimi)
    (out / "mimi_config.json").write_text(json.dumps(mimi_config.to_dict(), indent=1))
    save_file(random_mimi_state_dict(mimi_config, spec["mimi_seed"]), str(out / "mimi.safetensors"))
    shutil.copy(TOKENIZER, out / "tokenizer.model")
    return out


def build_pack(name: str, spec: dict, tmp: Path, *, check_hashes: bool = True) -> Pack:
    """Regenerate the pack's checkpoint under ``tmp`` and lay out its voice prompt as .pt, .safetensors, .wav."""
    ckpt = write_checkpoint(spec, tmp / "ckpt")
    if check_hashes:
        for file in ("model.safetensors", "mimi.safetensors"):
            assert sha256(ckpt / file) == spec["sha256"][file], (
                f"{name}: regenerated {file} differs from the one the goldens were made with (seeded generator changed?)"
            )
    voices = {"wav": VOICE_WAV}
    pt = DATA / name / "voice_prompt.pt"
    if pt.exists():
        voices["pt"] = pt
        prompt = torch.load(pt, weights_only=True)
        voices["safetensors"] = tmp / "voice_prompt.safetensors"
        save_file({k: prompt[k].contiguous() for k in ("embeddings", "cache")}, str(voices["safetensors"]))
    return Pack(name, spec, ckpt, voices)


def session_prefill(pack: Pack, session: dict, ct: int, *, reference_wav_codes: bool = False):
    """Our prefill for one session (``ct``: token-ring columns): voice prompt of its kind, silence, persona,
    silence. ``reference_wav_codes``: a ``.wav`` prompt takes the reference Mimi's stored codes of it instead of
    ours (no audio libraries needed)."""
    info = pack.info
    path = pack.voices[session["voice"]]
    if session["voice"] == "wav" and reference_wav_codes:
        voice = voice_frames_from_codes(info.lm, np.load(pack.dir / "voice_codes.npy"))
    elif session["voice"] == "wav":
        voice = voice_frames_from_codes(info.lm, encode_voice(info, path))
    else:
        voice = voice_frames_from_prompt(info.lm, load_voice_prompt(path, info.lm, ct))
    ids = persona_tokens(spm.SentencePieceProcessor(model_file=str(info.tokenizer)), session["persona"])
    return build_prefill(info.lm, voice=voice, persona_ids=ids)


def encode_voice(info: CheckpointInfo, path: Path) -> np.ndarray:
    """Our Mimi codes [8, F] of a voice-prompt wav (loudness-normalised, PersonaPlex's Mimi window)."""
    from inference.models.moshi.audio_prep import load_voice_wav

    return encode_pcm_personaplex(info, load_voice_wav(path))


def encode_user_audio(info: CheckpointInfo, path: Path) -> np.ndarray:
    """Our Mimi codes [8, F] of a user recording (24 kHz, no loudness change), PersonaPlex's Mimi window."""
    from inference.models.moshi.audio_prep import load_wav_24k

    return encode_pcm_personaplex(info, load_wav_24k(path))


def encode_pcm_personaplex(info: CheckpointInfo, pcm: np.ndarray) -> np.ndarray:
    codec = load_mimi(info.mimi_weights, MimiConfig.from_dict(info.mimi_config), num_codebooks=8)
    return torch.stack(list(stream_encode(codec, pcm, personaplex=True)), dim=1).numpy()


def run_ours(pack: Pack, rows: list[int]) -> np.ndarray:
    """Our tokens [len(rows), T, 17] for the given sessions run together in one batch (one row: solo)."""
    info = pack.info
    lm = load_lm(info.moshi_weights, info.lm)
    gen = LockstepGen(lm, len(rows), SamplingConfig(use_sampling=False))
    sessions = [pack.spec["sessions"][r] for r in rows]
    run_prefill(gen, [session_prefill(pack, s, gen.ct) for s in sessions])
    codes = torch.from_numpy(np.load(pack.dir / "user_codes.npy")[rows])
    return live_steps(gen, codes, keep_first=True).numpy().astype(np.int64)


def prefill_passes(pack: Pack, session: dict) -> int:
    """Model passes of the session's prefill, counted from its inputs: the voice's 1920-sample frames less the
    first (which makes no pass), 2 x 6 silence frames, one pass per persona token."""
    import soundfile

    frames = -(-soundfile.info(str(VOICE_WAV)).frames // 1920)
    ids = persona_tokens(spm.SentencePieceProcessor(model_file=str(TOKENIZER)), session["persona"])
    return frames - 1 + 12 + len(ids)


# ---- the reference side --------------------------------------------------------------------------------------


def reference_available() -> bool:
    return REF_PYTHON.exists()


def require_reference() -> None:
    """Skip without the reference venv. Only ``make test-reference`` runs the tests that call this (they are marked
    ``personaplex_reference``, which ``make test`` deselects), and it builds ``.venv-personaplex-ref`` first from a
    checkout of NVIDIA/personaplex at 3428dfd named by ``PARLEY_PERSONAPLEX_SRC``: the reference is on no package
    registry."""
    if not reference_available():
        pytest.skip(
            ".venv-personaplex-ref is not installed: `make test-reference` builds it from a checkout of "
            "NVIDIA/personaplex 3428dfd at $PARLEY_PERSONAPLEX_SRC"
        )


def run_reference_job(
    ckpt: Path, sessions: list[dict], tmp: Path, mimi_encode: list[dict] = (), voice_codes: list[dict] = ()
) -> None:
    """Run ``personaplex_ref_runner.py`` on ``ckpt`` for runner sessions, Mimi encodes and voice-wav codes (see its
    docstring), in one process."""
    job = tmp / "job.json"
    job.write_text(
        json.dumps(
            {"ckpt": str(ckpt), "sessions": sessions, "mimi_encode": list(mimi_encode), "voice_codes": list(voice_codes)}
        )
    )
    env = dict(os.environ, NO_TORCH_COMPILE="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [str(REF_PYTHON), str(REF_RUNNER), str(job)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def run_reference(pack: Pack, tmp: Path) -> dict:
    """Every session of the pack on the reference (solo, one process): tokens [S, T, 17]; plus one more session
    on the wav that keeps the ``.pt`` the reference makes from it and its Mimi codes of the wav."""
    sessions, outs = [], []
    codes = np.load(pack.dir / "user_codes.npy")
    for i, session in enumerate(pack.spec["sessions"]):
        np.save(tmp / f"codes{i}.npy", codes[i])
        voice = pack.voices["pt" if session["voice"] == "safetensors" else session["voice"]]
        outs.append(tmp / f"out{i}.npy")
        sessions.append(
            dict(voice=str(voice), persona=session["persona"], user_codes=str(tmp / f"codes{i}.npy"), out=str(outs[-1]))
        )
    np.save(tmp / "codes_extra.npy", codes[0, :, :1])
    extra = dict(voice=str(VOICE_WAV), persona=sessions[0]["persona"], user_codes=str(tmp / "codes_extra.npy"))
    extra.update(out=str(tmp / "out_extra.npy"), voice_pt_out=str(tmp / "voice_prompt.pt"))
    extra.update(voice_codes_out=str(tmp / "voice_codes.npy"))
    user_audio = dict(audio=str(USER_AUDIO), out=str(tmp / "user_audio_codes.npy"))
    run_reference_job(pack.ckpt, [*sessions, extra], tmp, [user_audio])
    return dict(
        tokens=np.stack([np.load(o) for o in outs]),
        voice_pt=tmp / "voice_prompt.pt",
        voice_codes=np.load(tmp / "voice_codes.npy"),
        user_audio_codes=np.load(tmp / "user_audio_codes.npy"),
    )
