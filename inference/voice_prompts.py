"""Voice clips -> voice prompts: decode, clean up and validate a clip, then compute each engine family's prompt.

Owned here (and reached by the web tier only through ``inference.api``):

- ``prepare_clip``: any audio file PyAV decodes (wav, flac, ogg/opus, webm, mp3, m4a, ...) -> 24 kHz mono,
  leading/trailing silence trimmed, loudness-normalised to -24 LUFS, validated. Every refusal is a
  ``VoiceClipError`` whose ``code`` says what is wrong and whose message says it for a person.
- ``prompt_targets`` / ``compute_prompt``: the processed prompt per engine family, as safetensors bytes. Lockstep
  engines (Moshi / PersonaPlex): the Mimi codes of the loudness-normalised clip, computed exactly as the engine
  computes them from a ``.wav`` prompt (``load_voice_wav`` then ``stream_encode``), so a session started from the
  stored codes equals one started from the wav. The unit engine (MiniCPM-o): the reference-audio embedding.
  The lockstep engine reads such a codes file with ``inference.models.moshi.codes_prompt.read_codes_prompt``.

Torch is imported only inside the prompt functions: ``prepare_clip`` needs PyAV, numpy and scipy only.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from inference.audio.loudness import LoudnessError, normalize_loudness
from inference.audio.resample import resample_clip
from inference.contracts import ParleyError
from inference.media_probe import MAX_DECODED_SAMPLES, VoiceClipError, open_media, read_header

__all__ = ["VoiceClipError"]  # re-exported: callers catch it from here

SAMPLE_RATE = 24_000
TARGET_LUFS = -24.0  # what the PersonaPlex reference (and ``audio_prep.load_voice_wav``) levels prompts to
MAX_UPLOAD_BYTES = 10 * 1024 * 1024
MAX_INPUT_S = 300.0  # 5 minutes of input, before trimming
MIN_SPEECH_S = 3.0
MAX_SPEECH_S = 30.0
SILENCE_DBFS = -50.0  # a 20 ms frame quieter than this is silence; a clip with nothing louder is silent
TRIM_RANGE_DB = 40.0  # frames more than this below the loudest frame count as silence at the ends
TRIM_PAD_S = 0.15  # kept around the speech so onsets and decays are not cut
CLIP_LEVEL = 0.999  # a sample at or above this magnitude (in the decoded source) is clipped
MAX_CLIPPED_FRACTION = 0.005  # more than 0.5 % clipped samples: too loud to clone from
TRUNCATION_TOLERANCE_S = 0.25  # decoded audio this much shorter than the header says: the file was cut

Progress = Callable[[str, float], None]
"""Called with (stage, fraction done in [0, 1])."""


@dataclass(frozen=True)
class PreparedClip:
    """A clip ready to compute prompts from.

    Attributes:
        pcm: float32 mono at 24 kHz, trimmed and loudness-normalised.
        wav: the same samples as a float32 WAV file (what is stored and what prompts are computed from).
        source_s: decoded length before trimming.
        speech_s: length after trimming.
    """

    pcm: np.ndarray
    wav: bytes
    source_s: float
    speech_s: float


def _noop(stage: str, fraction: float) -> None:
    pass


def prepare_clip(
    data: bytes,
    *,
    progress: Progress | None = None,
    min_speech_s: float = MIN_SPEECH_S,
    max_speech_s: float = MAX_SPEECH_S,
) -> PreparedClip:
    """Decode, downmix, resample, trim, check and normalise one clip (see the module docstring).

    Raises:
        VoiceClipError: with a code and a message naming the problem.
    """
    report = progress or _noop
    if not data:
        raise VoiceClipError("The file is empty.", code="empty")
    if len(data) > MAX_UPLOAD_BYTES:
        raise VoiceClipError(
            f"The file is {len(data) / 1e6:.1f} MB; at most {MAX_UPLOAD_BYTES // (1024 * 1024)} MB are accepted.",
            code="too_big",
        )
    report("decoding", 0.0)
    pcm, rate = _decode_mono(data, report)
    source_s = len(pcm) / rate
    clipped = float(np.mean(np.abs(pcm) >= CLIP_LEVEL)) if len(pcm) else 0.0
    report("resampling", 0.45)
    pcm = resample_clip(pcm, rate, SAMPLE_RATE)
    report("trimming silence", 0.55)
    pcm = _trim_silence(pcm)
    if pcm is None:
        raise VoiceClipError(
            f"The clip is silent: nothing in it is louder than {SILENCE_DBFS:.0f} dBFS.", code="silent"
        )
    if clipped > MAX_CLIPPED_FRACTION:
        raise VoiceClipError(
            f"The clip is clipped: {clipped:.1%} of its samples are at full scale (at most "
            f"{MAX_CLIPPED_FRACTION:.1%} are accepted). Record a little further from the microphone.",
            code="clipped",
        )
    speech_s = len(pcm) / SAMPLE_RATE
    if speech_s < min_speech_s:
        raise VoiceClipError(
            f"Only {speech_s:.1f} s of speech after trimming silence; at least {min_speech_s:.0f} s are needed.",
            code="too_short",
        )
    if speech_s > max_speech_s:
        raise VoiceClipError(
            f"{speech_s:.1f} s of speech after trimming silence; at most {max_speech_s:.0f} s are accepted.",
            code="too_long",
        )
    report("normalising loudness", 0.65)
    try:
        pcm = normalize_loudness(pcm, SAMPLE_RATE, TARGET_LUFS).astype(np.float32)
    except LoudnessError as exc:
        raise VoiceClipError(f"The clip's loudness cannot be measured: {exc}", code="silent") from exc
    # normalising can push peaks past full scale; the engine would read them back as they are, so keep them
    np.clip(pcm, -1.0, 1.0, out=pcm)
    return PreparedClip(pcm=pcm, wav=_wav_bytes(pcm), source_s=source_s, speech_s=speech_s)


def _decode_mono(data: bytes, report: Progress) -> tuple[np.ndarray, int]:
    """The first audio stream as float32 mono at its own rate; refuses, from the header (``media_probe``), what
    would decode too large before decoding it, and stops a stream that outgrows what its header said."""
    import av

    with open_media(data) as container:
        header = read_header(container, max_seconds=MAX_INPUT_S)
        stream = container.streams.audio[0]
        declared_s, rate = header.declared_s, header.rate
        most = min(MAX_INPUT_S * rate, MAX_DECODED_SAMPLES)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        chunks: list[np.ndarray] = []
        decoded = 0
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1)
                    chunks.append(chunk)
                    decoded += len(chunk)
                if decoded > most:  # containers without a duration (MediaRecorder webm), or one that lied, end here
                    raise VoiceClipError(
                        f"The clip is longer than {most / rate:.0f} s; at most {most / rate:.0f} s are accepted.",
                        code="too_long",
                    )
                if declared_s:
                    report("decoding", min(0.4, 0.4 * decoded / rate / declared_s))
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
        except av.error.MemoryError:
            raise  # not a damaged file: the sandbox's memory limit (clip_sandbox) says so
        except av.error.FFmpegError as exc:
            raise VoiceClipError(
                f"The audio data is damaged or cut short after {decoded / rate:.1f} s and cannot be decoded ({exc}).",
                code="truncated" if decoded else "corrupted",
            ) from exc
        format_name = container.format.name
    pcm = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    if not len(pcm):
        raise VoiceClipError("The file holds no audio samples.", code="truncated" if declared_s else "empty")
    if not np.isfinite(pcm).all():
        raise VoiceClipError("The audio holds invalid (non-finite) samples.", code="corrupted")
    if format_name == "wav" and _riff_chunks_cut_short(data):
        raise VoiceClipError(
            f"The file is truncated: its header promises more audio than the {len(pcm) / rate:.1f} s that are there.",
            code="truncated",
        )
    if declared_s is not None and len(pcm) / rate < declared_s - TRUNCATION_TOLERANCE_S:
        raise VoiceClipError(
            f"The file is truncated: its header says {declared_s:.1f} s but only {len(pcm) / rate:.1f} s are there.",
            code="truncated",
        )
    return pcm, rate


def _riff_chunks_cut_short(data: bytes) -> bool:
    """Whether libsndfile finds the WAV's chunks shorter than their headers say (FFmpeg silently decodes
    what is there). libsndfile reports such a chunk as ``data : 768000 (should be 383978)``."""
    import soundfile

    try:
        info = soundfile.info(io.BytesIO(data))
    except (RuntimeError, soundfile.LibsndfileError):
        return False
    return any(line.startswith("data") and "should be" in line for line in info.extra_info.splitlines())


def _trim_silence(pcm: np.ndarray) -> np.ndarray | None:
    """The clip from its first to its last non-silent 20 ms frame (plus a little padding); None if all silent."""
    hop = SAMPLE_RATE // 50
    frames = len(pcm) // hop
    if frames == 0:
        return None
    rms = np.sqrt(np.mean(pcm[: frames * hop].reshape(frames, hop).astype(np.float64) ** 2, axis=1))
    db = 20 * np.log10(np.maximum(rms, 1e-10))
    if db.max() < SILENCE_DBFS:
        return None
    loud = np.flatnonzero(db >= max(SILENCE_DBFS, db.max() - TRIM_RANGE_DB))
    pad = int(TRIM_PAD_S * SAMPLE_RATE)
    start = max(0, loud[0] * hop - pad)
    end = min(len(pcm), (loud[-1] + 1) * hop + pad)
    return pcm[start:end].copy()


def _wav_bytes(pcm: np.ndarray) -> bytes:
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, SAMPLE_RATE, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


# ---- prompts per engine family --------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptTarget:
    """One prompt to compute: for which engine family, with which checkpoint; ``model_key`` names the weights
    the prompt depends on (an engine uses a stored prompt only when its own key matches)."""

    family: str
    checkpoint: Path
    model_key: str


def prompt_targets(engine: str, checkpoint: Path | None) -> list[PromptTarget]:
    """The prompts the configured engine can use: none for echo, Mimi codes for lockstep, an embedding for unit."""
    if checkpoint is None or engine == "echo":
        return []
    checkpoint = Path(checkpoint)
    if engine in ("moshi", "personaplex", "lockstep"):
        from inference.models.moshi.config import CheckpointError, read_checkpoint_dir

        try:
            info = read_checkpoint_dir(checkpoint)
        except CheckpointError as exc:
            raise ParleyError(f"cannot read checkpoint {checkpoint}: {exc}", code="internal_error") from exc
        return [PromptTarget("lockstep", checkpoint, "mimi-" + _file_digest(Path(info.mimi_weights)))]
    if engine in ("minicpmo", "unit"):
        return [PromptTarget("unit", checkpoint, "minicpmo-" + _dir_digest(checkpoint))]
    return []


@lru_cache(maxsize=8)
def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _dir_digest(directory: Path) -> str:
    """Weights files' names and sizes (a full hash of ~18 GB is not worth it here) plus the config."""
    digest = hashlib.sha256()
    for path in sorted(directory.glob("*")):
        if path.is_file():
            digest.update(f"{path.name}:{path.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def compute_prompt(wav_path: Path, target: PromptTarget, progress: Progress | None = None) -> bytes:
    """The target family's prompt for a prepared clip's wav, as safetensors bytes."""
    report = progress or _noop
    if target.family == "lockstep":
        return _lockstep_codes(wav_path, target, report)
    if target.family == "unit":
        return _unit_embedding(wav_path, target, report)
    raise ParleyError(f"no voice prompt for engine family {target.family!r}", code="internal_error")


@lru_cache(maxsize=2)
def _mimi_for(checkpoint: Path):
    from inference.models.moshi.config import read_checkpoint_dir
    from inference.models.moshi.mimi_config import MimiConfig
    from inference.models.moshi.mimi_loading import load_mimi

    info = read_checkpoint_dir(checkpoint)
    config = MimiConfig.from_dict(info.mimi_config) if info.mimi_config else MimiConfig.kyutai_default()
    return load_mimi(info.mimi_weights, config, num_codebooks=8, device="cpu")


def _lockstep_codes(wav_path: Path, target: PromptTarget, report: Progress) -> bytes:
    import torch
    from safetensors.torch import save

    from inference.models.moshi.audio_prep import load_voice_wav
    from inference.models.moshi.config import read_checkpoint_dir
    from inference.models.moshi.personaplex import FRAME_SAMPLES, stream_encode

    report("loading the Mimi codec", 0.0)
    codec = _mimi_for(target.checkpoint)
    personaplex = read_checkpoint_dir(target.checkpoint).lm.personaplex
    pcm = load_voice_wav(wav_path)  # exactly what the engine does with a .wav prompt
    total = max(1, math.ceil(len(pcm) / FRAME_SAMPLES))
    codes = []
    for index, frame_codes in enumerate(stream_encode(codec, pcm, personaplex=personaplex)):
        codes.append(frame_codes)
        if index % 10 == 0:
            report("encoding Mimi codes", index / total)
    tensor = torch.stack(codes, dim=1).to(torch.int64).contiguous()  # [8, F]
    return save({"codes": tensor}, metadata=_metadata(target))


def _unit_embedding(wav_path: Path, target: PromptTarget, report: Progress) -> bytes:
    import torch
    from safetensors.torch import save

    from inference.engines.unit import load_reference_audio
    from inference.models.minicpmo.loading import load_model

    report("loading the audio encoder", 0.0)
    parts = load_model(target.checkpoint, device="cpu")
    audio = load_reference_audio(wav_path)  # 16 kHz mono, as the unit engine reads a voice reference
    report("embedding the reference audio", 0.5)
    with torch.no_grad():
        embedding = parts.audio.embed_reference(audio)
    return save({"embedding": embedding.float().cpu().contiguous()}, metadata=_metadata(target))


def _metadata(target: PromptTarget) -> dict[str, str]:
    return {"family": target.family, "model_key": target.model_key, "sample_rate": str(SAMPLE_RATE)}


PT_MODEL_KEY = "personaplex-pt"  # an imported PersonaPlex .pt prompt: embeddings of the PersonaPlex LM itself


def convert_pt_prompt(data: bytes) -> bytes:
    """A PersonaPlex voice ``.pt`` (``{"embeddings": [E, 1, 1, dim] float, "cache": [1, K, CT] int}``) loaded with
    ``weights_only=True`` and written back as safetensors (what the engine reads, and no pickle is ever kept).

    Raises:
        VoiceClipError(code="bad_prompt"): not a loadable tensor file, or not those two tensors.
    """
    import torch
    from safetensors.torch import save

    if not data:
        raise VoiceClipError("The file is empty.", code="empty")
    try:
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a refused or broken pickle; all mean "not a prompt"
        raise VoiceClipError(
            f"Not a PersonaPlex voice prompt: torch.load(weights_only=True) refused it ({type(exc).__name__}).",
            code="bad_prompt",
        ) from exc
    if not isinstance(loaded, dict) or set(loaded) != {"embeddings", "cache"}:
        found = sorted(map(str, loaded)) if isinstance(loaded, dict) else type(loaded).__name__
        raise VoiceClipError(
            f"Not a PersonaPlex voice prompt: expected the tensors 'embeddings' and 'cache', found {found}.",
            code="bad_prompt",
        )
    emb, cache = loaded["embeddings"], loaded["cache"]
    if not isinstance(emb, torch.Tensor) or emb.dim() != 4 or emb.shape[1:3] != (1, 1) or not emb.is_floating_point():
        raise VoiceClipError("Not a PersonaPlex voice prompt: 'embeddings' must be a float [E, 1, 1, dim] tensor.",
                             code="bad_prompt")  # fmt: skip
    if not torch.isfinite(emb).all():
        raise VoiceClipError("Not a PersonaPlex voice prompt: 'embeddings' holds non-finite values.", code="bad_prompt")
    if not isinstance(cache, torch.Tensor) or cache.dim() != 3 or cache.shape[0] != 1 or cache.is_floating_point():
        raise VoiceClipError("Not a PersonaPlex voice prompt: 'cache' must be an integer [1, K, CT] tensor.",
                             code="bad_prompt")  # fmt: skip
    metadata = {"family": "lockstep", "model_key": PT_MODEL_KEY, "dim": str(emb.shape[-1])}
    return save({"embeddings": emb.float().contiguous(), "cache": cache.long().contiguous()}, metadata=metadata)
