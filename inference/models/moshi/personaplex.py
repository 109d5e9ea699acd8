"""PersonaPlex session start: voice prompt, silence, persona text, silence (the reference's prefill order).

A prefill is a list of ``PrefillFrame`` s, each one model pass with forced tokens (or an input embedding, for
a ``.pt`` / ``.safetensors`` voice prompt), plus an optional token-ring restore after the voice frames. The
engine feeds these frames to its slot through the same batched ``LockstepGen.step`` the live slots use, so a
joining slot never needs a step of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from inference.models.moshi.config import CheckpointError, LMConfig
from inference.models.moshi.text import TEXT_PAD

SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)  # Mimi codes of agent silence
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)  # Mimi codes of a 440 Hz tone (user side)
AUDIO_SILENCE_FRAMES = 6  # int(0.5 s * 12.5 Hz)
SYSTEM_TAG = "<system>"
DEFAULT_PERSONA = "You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way."
FRAME_SAMPLES = 1920
MAX_VOICE_FRAMES = 750  # 60 s: a longer prompt only delays the session start (the reference's voices are ~10 s)


class VoicePromptError(ValueError):
    """A voice prompt file cannot be used (wrong format, keys, shapes or size)."""


@dataclass(frozen=True)
class VoicePrompt:
    """A voice prompt in the reference's ``.pt`` form.

    Attributes:
        embeddings: [E, 1, 1, dim] summed input embeddings, one per model pass.
        cache: [1, K, CT] long: the token ring after the prompt.
    """

    embeddings: torch.Tensor
    cache: torch.Tensor


@dataclass
class PrefillFrame:
    """One prefill pass: forced tokens [K] with mask [K], or an input embedding [1, dim]."""

    forced: torch.Tensor
    forced_mask: torch.Tensor
    embedding: torch.Tensor | None = None
    restore_cache_after: torch.Tensor | None = None  # [K, CT], copied into the ring after this pass


@dataclass
class Prefill:
    """The frames of a session start, consumed front to back."""

    frames: list[PrefillFrame] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.frames)


def wrap_persona(text: str) -> str:
    """``<system> {text} <system>`` unless the stripped text already starts and ends with the tag."""
    text = text.strip()
    if text.startswith(SYSTEM_TAG) and text.endswith(SYSTEM_TAG):
        return text
    return f"{SYSTEM_TAG} {text} {SYSTEM_TAG}"


def persona_tokens(tokenizer, text: str) -> list[int]:
    """SentencePiece ids of the wrapped persona (plain encode: no BOS/EOS)."""
    if not text or not text.strip():
        raise ValueError("persona text is empty")
    return list(tokenizer.encode(wrap_persona(text)))


def load_voice_prompt(path: str | Path, config: LMConfig, ct: int) -> VoicePrompt:
    """Read a ``.pt`` (``torch.load(weights_only=True)``) or ``.safetensors`` voice prompt and check it."""
    path = Path(path)
    if not path.is_file():
        raise VoicePromptError(f"voice prompt {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".pt":
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many types for a bad pickle; all mean "not a voice prompt"
            raise VoicePromptError(f"{path}: not a readable voice prompt .pt ({type(exc).__name__}: {exc})") from exc
    elif suffix == ".safetensors":
        from inference.models.moshi.loading import read_safetensors

        try:
            data = read_safetensors(path)
        except CheckpointError as exc:
            raise VoicePromptError(str(exc)) from exc
    else:
        raise VoicePromptError(f"{path}: voice prompt must be .pt, .safetensors or .wav")
    if not isinstance(data, dict) or "embeddings" not in data or "cache" not in data:
        raise VoicePromptError(f"{path}: expected the keys 'embeddings' and 'cache'")
    emb, cache = data["embeddings"], data["cache"]
    if not isinstance(emb, torch.Tensor) or emb.dim() != 4 or tuple(emb.shape[1:]) != (1, 1, config.dim):
        raise VoicePromptError(f"{path}: embeddings must be [E, 1, 1, {config.dim}], got {_shape(emb)}")
    if not 1 <= emb.shape[0] <= MAX_VOICE_FRAMES:
        raise VoicePromptError(f"{path}: {emb.shape[0]} voice frames; 1..{MAX_VOICE_FRAMES} are accepted")
    if not emb.dtype.is_floating_point or not torch.isfinite(emb).all():
        raise VoicePromptError(f"{path}: embeddings must be a non-empty finite float tensor")
    if not isinstance(cache, torch.Tensor) or tuple(cache.shape) != (1, config.num_codebooks, ct):
        raise VoicePromptError(f"{path}: cache must be [1, {config.num_codebooks}, {ct}], got {_shape(cache)}")
    cache = cache.long()
    limit = torch.tensor([config.text_card] + [config.card] * config.n_q).view(1, -1, 1)
    if ((cache < 0) | (cache > limit)).any():
        raise VoicePromptError(f"{path}: cache holds token ids out of range")
    return VoicePrompt(embeddings=emb.float(), cache=cache)


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def _frame(config: LMConfig, text: int | None, agent, user) -> PrefillFrame:
    K = config.num_codebooks
    forced = torch.zeros(K, dtype=torch.long)
    mask = torch.zeros(K, dtype=torch.bool)
    if text is not None:
        forced[0], mask[0] = text, True
    if agent is not None:
        forced[1:9], mask[1:9] = torch.as_tensor(agent, dtype=torch.long), True
    if user is not None:
        forced[9:17], mask[9:17] = torch.as_tensor(user, dtype=torch.long), True
    return PrefillFrame(forced=forced, forced_mask=mask)


def voice_frames_from_prompt(config: LMConfig, prompt: VoicePrompt) -> list[PrefillFrame]:
    """Embedding replay: each pass takes one saved embedding; the forced dummy frame (text PAD, all audio at
    the initial token) only touches ring entries the restore overwrites. The ring is restored after the last."""
    dummy = [config.card] * 8
    frames = []
    for i in range(prompt.embeddings.shape[0]):
        f = _frame(config, TEXT_PAD, dummy, dummy)
        f.embedding = prompt.embeddings[i, 0]  # [1, dim]
        frames.append(f)
    frames[-1].restore_cache_after = prompt.cache[0]
    return frames


def voice_frames_from_codes(config: LMConfig, codes: np.ndarray | torch.Tensor) -> list[PrefillFrame]:
    """The wav path: agent = the prompt's Mimi codes [8, F], text PAD, user = sine codes.

    The reference's first call of a session makes no model pass and the initial-token rule then overwrites
    everything it wrote, so frame 0 contributes nothing: passes start at frame 1.
    """
    codes = torch.as_tensor(np.asarray(codes), dtype=torch.long)
    if codes.dim() != 2 or codes.shape[0] != 8 or codes.shape[1] < 2:
        raise VoicePromptError(f"voice prompt codes must be [8, F >= 2], got {tuple(codes.shape)}")
    return [_frame(config, TEXT_PAD, codes[:, f], SINE_TOKENS) for f in range(1, codes.shape[1])]


def voice_pass_count(num_samples: int) -> int:
    """How many frames ``iter_voice_frames_from_pcm`` yields for ``num_samples`` of audio (frame 0 makes none)."""
    return max(0, -(-num_samples // FRAME_SAMPLES) - 1)


def stream_encode(codec, pcm: np.ndarray, *, personaplex: bool) -> Iterator[torch.Tensor]:
    """Mimi codes [8] (host) of each 1920-sample frame of float32 24 kHz ``pcm`` (last frame zero-padded),
    encoded lazily with a private codec stream (``personaplex``: the NVIDIA/personaplex fork's attention
    window, see ``MimiCodec.init_stream``)."""
    n = -(-len(pcm) // FRAME_SAMPLES) * FRAME_SAMPLES
    pcm = np.pad(np.asarray(pcm, dtype=np.float32), (0, n - len(pcm)))
    device = next(codec.parameters()).device
    state = codec.init_stream(1, personaplex=personaplex)
    for start in range(0, n, FRAME_SAMPLES):
        chunk = torch.from_numpy(pcm[start : start + FRAME_SAMPLES]).to(device).view(1, 1, FRAME_SAMPLES)
        with torch.no_grad():
            codes = codec.encode_step(chunk, state)[0, :, 0].cpu()
        yield codes  # outside no_grad: a generator suspended inside it would leak the mode to the caller


def iter_voice_frames_from_pcm(codec, pcm: np.ndarray, config: LMConfig) -> Iterator[PrefillFrame]:
    """The wav path, lazily: one Mimi-encoded frame per pass, so a long prompt costs one encode per tick
    instead of one long stall."""
    for index, codes in enumerate(stream_encode(codec, pcm, personaplex=True)):
        if index > 0:  # frame 0 makes no model pass (see voice_frames_from_codes)
            yield _frame(config, TEXT_PAD, codes, SINE_TOKENS)


def build_prefill(
    config: LMConfig,
    *,
    voice: list[PrefillFrame] | None,
    persona_ids: list[int] | None,
    silence_frames: int = AUDIO_SILENCE_FRAMES,
) -> Prefill:
    """Voice frames, silence, persona tokens one per frame, silence (agent silence / user sine / text PAD)."""
    frames = list(voice or [])
    silence = [_frame(config, TEXT_PAD, SILENCE_TOKENS, SINE_TOKENS) for _ in range(silence_frames)]
    frames += silence
    for token in persona_ids or []:
        frames.append(_frame(config, int(token), SILENCE_TOKENS, SINE_TOKENS))
    frames += [_frame(config, TEXT_PAD, SILENCE_TOKENS, SINE_TOKENS) for _ in range(silence_frames)]
    return Prefill(frames=frames)
