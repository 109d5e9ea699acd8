"""Run the reference Token2Wav (PyPI ``minicpmo`` 0.1.2, module ``stepaudio2.token2wav``) on CPU over the tiny
random assets and store what it produced, for the parity tests. Runs in ``.venv-minicpmo-ref`` only:

    .venv/bin/python -m inference make-token2wav-assets --out /tmp/t2w   # the project's generator
    .venv-minicpmo-ref/bin/python tests/inference/models/minicpmo/token2wav_ref_runner.py /tmp/t2w OUT.npz

The reference is imported and called, never copied. What this script changes around it, and why:
- CUDA -> CPU: ``.cuda()`` is a no-op and ``device='cuda'`` becomes CPU (the reference hard-codes CUDA).
- ``torchaudio.load`` reads with soundfile, and torchaudio's compiled extension is not loaded (the PyPI
  torchaudio wheel does not match this torch; the code paths used here are pure torch).
- Sizes: HiFT is built with the assets' channel widths and the S3 tokenizer with their dimensions (the
  reference hard-codes the published sizes; the code run is the same).
- Randomness: the flow's starting noise is one seeded draw (the reference draws it unseeded at construction)
  and the global RNG is seeded before each ``stream`` call (HiFT's source draws from it).
"""

from __future__ import annotations

import functools
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

# --- environment patches (before importing the reference) -------------------------------------------------
_ext = types.ModuleType("torchaudio._extension")
_ext._IS_TORCHAUDIO_EXT_AVAILABLE = False
_ext.fail_if_no_align = lambda f: f
_ext._load_lib = lambda *a, **k: False
sys.modules["torchaudio._extension"] = _ext
import torchaudio  # noqa: E402


def _sf_load(path, *args, **kwargs):
    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    return torch.from_numpy(audio.T.copy()), rate


torchaudio.load = _sf_load
torch.Tensor.cuda = lambda self, *a, **k: self
torch.nn.Module.cuda = lambda self, *a, **k: self


def _cpu(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return fn(*args, **kwargs)

    return wrapper


for _name in ("tensor", "zeros", "ones"):
    setattr(torch, _name, _cpu(getattr(torch, _name)))

import s3tokenizer.model_v2 as s3v2  # noqa: E402
import stepaudio2.token2wav as t2w  # noqa: E402
from stepaudio2.flashcosyvoice.modules.hifigan import ConvRNNF0Predictor, HiFTGenerator  # noqa: E402

NOISE_SEED = 0
HIFT_SEED = 1000
SILENCE = 4218
LOOKAHEAD = 3

# (name, prompt seconds, prompt seed, unit code counts, n_timesteps)
SCENARIOS = [
    ("a", 2.0, 11, [25, 25, 25], 5),
    ("b", 3.2, 12, [25, 12], 10),
]


def prompt_audio(seconds: float, seed: int) -> np.ndarray:
    """A voiced-sounding test prompt at 16 kHz: a gliding harmonic tone with noise, fading in and out."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000
    tone = sum(np.sin(k * phase) / k for k in range(1, 6))
    env = np.minimum(1, np.minimum(t, t[-1] - t) * 8)
    return (0.3 * env * tone + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def plan(codes: list[list[int]]) -> list[tuple[list[int], bool]]:
    """Chunks as the engine streams them: 3 silence codes first, 25 + 3 look-ahead per chunk, a final flush."""
    buffer = [SILENCE] * LOOKAHEAD
    out = []
    for unit in codes:
        buffer += unit
        while len(buffer) >= LOOKAHEAD + 5:
            take = min(25 + LOOKAHEAD, len(buffer))
            out.append((buffer[:take], False))
            buffer = buffer[min(25, take - LOOKAHEAD) :]
    out.append((buffer, True))
    return out


def main(asset_dir: str, out_path: str) -> None:
    torch.set_num_threads(1)
    cfg = s3v2.ModelConfig(n_audio_state=128, n_audio_head=2, n_audio_layer=2)
    s3v2.S3TokenizerV2.__init__.__defaults__ = (cfg,)
    hift_sd = torch.load(f"{asset_dir}/hift.pt", map_location="cpu", weights_only=True)
    base = int(hift_sd["conv_pre.weight_v"].shape[0])
    f0_ch = int(hift_sd["f0_predictor.condnet.0.weight_v"].shape[0])
    t2w.HiFTGenerator = lambda: HiFTGenerator(base_channels=base, f0_predictor=ConvRNNF0Predictor(cond_channels=f0_ch))
    model = t2w.Token2wav(asset_dir, float16=False)
    noise = torch.randn([1, 80, 50 * 600], generator=torch.Generator().manual_seed(NOISE_SEED))
    model.flow.decoder.rand_noise = noise

    chunk_mels: list[torch.Tensor] = []
    inner = model.flow.inference_chunk

    def record(*args, **kwargs):
        mel, cache = inner(*args, **kwargs)
        chunk_mels.append(mel.clone())
        return mel, cache

    model.flow.inference_chunk = record
    result: dict[str, np.ndarray] = {}
    tmp = Path(tempfile.mkdtemp(prefix="t2w-ref-"))
    for name, seconds, seed, units, steps in SCENARIOS:
        audio = prompt_audio(seconds, seed)
        wav = tmp / f"{name}.wav"
        sf.write(wav, audio, 16000, subtype="FLOAT")
        model.n_timesteps = steps
        model.stream_cache, model.hift_cache_dict = model.set_stream_cache(str(wav))
        tokens, tokens_len, spk, prompt_mel, _ = model.cache
        rng = np.random.default_rng(seed + 100)
        codes = [rng.integers(0, 6561, n).tolist() for n in units]
        result[f"{name}/prompt_audio"] = audio
        result[f"{name}/prompt_tokens"] = tokens.numpy().astype(np.int32)
        result[f"{name}/spk"] = spk.numpy().astype(np.float32)
        result[f"{name}/prompt_mel"] = prompt_mel.numpy().astype(np.float32)
        result[f"{name}/n_timesteps"] = np.array(steps)
        result[f"{name}/unit_sizes"] = np.array(units)
        result[f"{name}/codes"] = np.array(sum(codes, []), dtype=np.int32)
        chunk_mels.clear()
        for k, (chunk, last) in enumerate(plan(codes)):
            torch.manual_seed(HIFT_SEED + k)
            wave = model.stream(chunk, prompt_wav=str(wav), last_chunk=last, return_waveform=True)
            result[f"{name}/chunk{k}/tokens"] = np.array(chunk, dtype=np.int32)
            result[f"{name}/chunk{k}/last"] = np.array(last)
            result[f"{name}/chunk{k}/mel"] = chunk_mels[-1].numpy().astype(np.float32)
            result[f"{name}/chunk{k}/wave"] = np.asarray(wave, dtype=np.float32)
        result[f"{name}/chunks"] = np.array(k + 1)
    np.savez_compressed(out_path, **result)
    print(f"wrote {out_path}: {len(result)} arrays")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
