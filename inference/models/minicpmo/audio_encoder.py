"""Streaming audio input of MiniCPM-o 4.5: Whisper log-mel front end, Whisper encoder with a KV cache
carried across units, the audio projector and 5x average pooling (50 encoder frames/s -> 10 LLM tokens/s).

The encoder is written here rather than taken from ``transformers.WhisperEncoder`` because the duplex path
needs what that class does not offer: per-session key/value caches that grow unit by unit with unmasked
attention over the whole session, a position offset equal to the cached length, and the conv-output trim
of the streaming front end. Parameter names match the published ``apm.*`` layout.

Per-session state lives in ``AudioStreamState`` so that one loaded encoder serves many sessions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from transformers.audio_utils import mel_filter_bank

from inference.models.minicpmo.config import AudioConfig
from inference.models.minicpmo.streaming_mel import HOP, N_FFT, PAD, MelCache

SAMPLE_RATE = 16000
UNIT_SAMPLES = 16000  # one unit is one second of 16 kHz audio
FIRST_UNIT_PAD = 560  # 1035 ms first chunk: the reference left-pads unit 0 with 35 ms of zeros
CORE_FRAMES = 100  # mel frames per unit
CONTEXT_FRAMES = 2  # 20 ms of CNN context on each side of a unit's core frames
DYNAMIC_FLOOR_SAMPLES = 5 * SAMPLE_RATE  # below 5 s of buffer the log floor is fixed (-10), above it max - 8
# Long calls: the reference recomputes the mel buffer whole every unit, so it slides once it reaches 30 s (by
# 10 s), as the reference's optional trigger-mode window does (here only the changed blocks are recomputed,
# streaming_mel.py). Frames handed on keep global coordinates.
MEL_SLIDE_TRIGGER = 30 * SAMPLE_RATE
MEL_SLIDE_STRIDE = 10 * SAMPLE_RATE
MEL_SLIDE_KEEP = 1 * SAMPLE_RATE
REFERENCE_MAX_SAMPLES = 30 * SAMPLE_RATE  # a reference voice clip longer than 30 s is cut


class MelFrontEnd:
    """Whisper log-mel (n_fft 400, hop 160, 80 Slaney filters) shared by all sessions (stateless)."""

    def __init__(self, n_mels: int = 80):
        filters = mel_filter_bank(
            num_frequency_bins=1 + N_FFT // 2,
            num_mel_filters=n_mels,
            min_frequency=0.0,
            max_frequency=8000.0,
            sampling_rate=SAMPLE_RATE,
            norm="slaney",
            mel_scale="slaney",
        )
        self.filters = torch.from_numpy(np.asarray(filters, dtype=np.float32))  # [201, n_mels]
        self.window = torch.hann_window(N_FFT)

    def frame_log_mel(self, padded: np.ndarray) -> torch.Tensor:
        """Unfloored log10 mel [n_mels, F] of every whole frame of already padded samples (frame ``f`` is
        ``padded[f * HOP : f * HOP + N_FFT]``)."""
        wave = torch.from_numpy(np.ascontiguousarray(padded, dtype=np.float32))
        spec = torch.stft(wave, n_fft=N_FFT, hop_length=HOP, window=self.window, center=False, return_complex=True)
        mel = self.filters.T @ (spec.abs() ** 2)  # [n_mels, F]
        return torch.clamp(mel, min=1e-10).log10()

    def log_mel(self, audio: np.ndarray, *, dynamic_floor: bool) -> torch.Tensor:
        """Log-mel of a whole clip, scaled as Whisper does.

        Args:
            audio: float32 [N] at 16 kHz, N >= 400.
            dynamic_floor: clip at ``max - 8`` (True) or at the fixed floor -10 (False).

        Returns:
            float32 [n_mels, N // 160] (the last STFT frame is dropped).
        """
        log = self.frame_log_mel(np.pad(np.asarray(audio, dtype=np.float32), PAD, mode="reflect"))[:, :-1]
        floor = log.max() - 8.0 if dynamic_floor else torch.tensor(-10.0)
        log = torch.maximum(log, floor)
        return (log + 4.0) / 4.0


@dataclass
class AudioStreamState:
    """One session's streaming audio state: input carry, mel buffer and encoder KV cache."""

    carry: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    mel_buffer: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    buffer_base_frame: int = 0  # global mel frame index of mel_buffer's first frame
    mel_cache: MelCache = field(default_factory=MelCache)  # mel_buffer's log-mel, kept across units
    units: int = 0  # units consumed so far
    # Encoder cache: per layer (keys, values), each [1, heads, T_cached, head_dim].
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def cached_frames(self) -> int:
        """Encoder frames in the cache (also the next position offset)."""
        return 0 if self.kv is None else int(self.kv[0][0].shape[2])

    def nbytes(self) -> int:
        """Host and tensor bytes held by this state."""
        total = self.carry.nbytes + self.mel_buffer.nbytes + self.mel_cache.nbytes()
        for k, v in self.kv or []:
            total += k.numel() * k.element_size() + v.numel() * v.element_size()
        return total


class WhisperAttention(nn.Module):
    """Multi-head self-attention with Whisper's layout (k_proj has no bias), optionally over a cache."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, D]
        past: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,  # bool [T, T_past + T], True = may attend
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        B, T, D = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = self.k_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # [B, H, T_past + T, hd]
            v = torch.cat([past[1], v], dim=2)
        out = self.attend(q, k, v, mask)  # [B, T, H, hd]
        return self.out_proj(out.reshape(B, T, D)), (k, v)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Each query over the keys (the last T of them are its own unit's): [B, T, H, hd]. On CUDA
        ``use_row_invariant_kernels`` replaces this on each instance."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


class WhisperEncoderLayer(nn.Module):
    """Pre-LN transformer layer (GELU MLP), Whisper naming."""

    def __init__(self, cfg: AudioConfig):
        super().__init__()
        d = cfg.d_model
        self.self_attn = WhisperAttention(d, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attn, kv = self.self_attn(self.self_attn_layer_norm(x), past, mask)
        x = x + attn
        x = x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))
        return x, kv


class WhisperEncoder(nn.Module):
    """Conv stem, learned positions, pre-LN layers, final LayerNorm (``apm.*``)."""

    def __init__(self, cfg: AudioConfig):
        super().__init__()
        d = cfg.d_model
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(cfg.max_source_positions, d)
        self.layers = nn.ModuleList(WhisperEncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.layer_norm = nn.LayerNorm(d)

    def stem(self, mel: torch.Tensor) -> torch.Tensor:
        """[B, n_mels, F] -> [B, ceil(F / 2), D]."""
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x))
        return x.transpose(1, 2)

    def encode(
        self,
        x: torch.Tensor,  # [B, T, D] stem output
        past: list[tuple[torch.Tensor, torch.Tensor]] | None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        offset = 0 if past is None else int(past[0][0].shape[2])
        T = x.shape[1]
        positions = self.embed_positions.weight
        if offset + T > positions.shape[0]:
            raise ValueError(f"audio encoder positions exhausted ({offset + T} > {positions.shape[0]})")
        x = x + positions[offset : offset + T]
        new_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, None if past is None else past[i], mask)
            new_kv.append(kv)
        return self.layer_norm(x), new_kv


class ReluProjector(nn.Module):
    """Linear -> ReLU -> Linear from one width to another.

    The audio projector (encoder width -> LLM width, ``audio_projection_layer.*``) and the TTS projectors (LLM
    width -> TTS width, ``tts.projector_semantic.*`` / ``tts.projector_spk.*``) share this shape.
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.linear1 = nn.Linear(in_dim, out_dim)
        self.linear2 = nn.Linear(out_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(F.relu(self.linear1(x)))


class StreamingAudioInput(nn.Module):
    """Audio encoder + projector + pooling, driven unit by unit with an explicit per-session state."""

    def __init__(self, cfg: AudioConfig, llm_dim: int, pool_step: int):
        super().__init__()
        self.apm = WhisperEncoder(cfg)
        self.audio_projection_layer = ReluProjector(cfg.d_model, llm_dim)
        self.pool_step = pool_step
        self.front_end = MelFrontEnd(cfg.num_mel_bins)

    def _to_param(self, mel: torch.Tensor) -> torch.Tensor:
        """The mel is computed on the host in float32; move it to the encoder's device and dtype."""
        weight = self.apm.conv1.weight
        return mel.to(device=weight.device, dtype=weight.dtype)

    def _project(self, states: torch.Tensor) -> torch.Tensor:
        """[1, T, d] encoder states -> [T // pool, llm_dim] LLM embeddings."""
        emb = self.audio_projection_layer(states)  # [1, T, llm]
        emb = F.avg_pool1d(emb.transpose(1, 2), self.pool_step, self.pool_step).transpose(1, 2)
        return emb[0]

    @torch.inference_mode()
    def embed_reference(self, audio: np.ndarray) -> torch.Tensor:
        """Non-streaming embeddings of a whole reference clip (10 per second).

        The clip is encoded in one pass with a block-causal mask of 1 s blocks: each encoder frame sees
        its own block and all earlier ones.
        """
        if audio.ndim != 1 or audio.shape[0] < N_FFT:
            raise ValueError(f"reference audio must be mono with at least {N_FFT} samples")
        audio = audio[:REFERENCE_MAX_SAMPLES]
        frames = audio.shape[0] // HOP
        # The reference pads the clip with zeros to 30 s before the STFT, then keeps the clip's frames;
        # the zeros (not reflection) shape the last frames, so pad the same way.
        padded = np.zeros(REFERENCE_MAX_SAMPLES, dtype=np.float32)
        padded[: audio.shape[0]] = audio
        mel = self.front_end.log_mel(padded, dynamic_floor=True)[None, :, :frames]  # [1, 80, F]
        x = self.apm.stem(self._to_param(mel))  # [1, T, d]
        T = x.shape[1]
        block = CORE_FRAMES // 2  # 50 encoder frames per second
        idx = torch.arange(T)
        mask = ((idx[None, :] // block) <= (idx[:, None] // block)).to(x.device)  # [T, T]
        states, _ = self.apm.encode(x, None, mask)
        usable = (T // self.pool_step) * self.pool_step
        return self._project(states[:, :usable])

    def _append_audio(self, state: AudioStreamState, samples: np.ndarray) -> np.ndarray:
        """Add a unit's samples to the carry; return the samples that go to the mel stage."""
        if state.units == 0:
            samples = np.concatenate([np.zeros(FIRST_UNIT_PAD, np.float32), samples])
            take = ((UNIT_SAMPLES + FIRST_UNIT_PAD) // HOP) * HOP  # 16480: aligned down to the hop
        else:
            take = UNIT_SAMPLES
        pending = np.concatenate([state.carry, samples.astype(np.float32, copy=False)])
        state.carry = pending[take:].copy()
        return pending[:take]

    def _unit_mel(self, state: AudioStreamState, chunk: np.ndarray) -> torch.Tensor:
        """Append ``chunk`` to the session's mel buffer and return this unit's frames [80, 102 or 104]."""
        state.mel_buffer = np.concatenate([state.mel_buffer, chunk])
        dropped = 0
        if state.mel_buffer.shape[0] >= MEL_SLIDE_TRIGGER:
            drop = min(MEL_SLIDE_STRIDE, state.mel_buffer.shape[0] - MEL_SLIDE_KEEP)
            drop = (drop // HOP) * HOP
            state.mel_buffer = state.mel_buffer[drop:]
            state.buffer_base_frame += drop // HOP
            dropped = drop // HOP
        state.mel_cache.update(self.front_end, state.mel_buffer, dropped)
        dynamic = state.mel_buffer.shape[0] >= DYNAMIC_FLOOR_SAMPLES
        start = max(0, CORE_FRAMES * state.units - CONTEXT_FRAMES) - state.buffer_base_frame
        stop = CORE_FRAMES * (state.units + 1) + CONTEXT_FRAMES - state.buffer_base_frame
        start = max(0, start)
        stop = min(stop, state.mel_cache.frames)  # the whole-buffer slice ended at the buffer's last frame
        return state.mel_cache.scaled(start, stop, dynamic)

    @torch.inference_mode()
    def unit_mel(self, state: AudioStreamState, samples: np.ndarray) -> tuple[torch.Tensor, bool]:
        """The host half of a unit: advances the carry and the mel buffer (``state.units`` is left as it is).

        Returns:
            (the unit's mel frames [80, 102 on the first unit, else 104], whether the encoder cache must be
            emptied first: the reference resets it before its 1500 learned positions run out, ~29 s).
        """
        if samples.shape != (UNIT_SAMPLES,):
            raise ValueError(f"a unit is {UNIT_SAMPLES} mono samples, got shape {tuple(samples.shape)}")
        mel = self._unit_mel(state, self._append_audio(state, samples))
        needed = math.ceil(mel.shape[1] / 2)
        cached = state.cached_frames
        return mel, cached > 0 and cached + needed >= self.apm.embed_positions.num_embeddings

    @torch.inference_mode()
    def unit_stem(self, mel: torch.Tensor, *, first: bool) -> torch.Tensor:
        """[B, 80, F] mel frames of units (all first units or none) -> their 50 stem frames [B, 50, d]."""
        x = self.apm.stem(self._to_param(mel))  # [B, 51 or 52, d]
        return x[:, :-1] if first else x[:, 1:-1]  # drop the context outputs: 50 frames remain

    @torch.inference_mode()
    def embed_unit(self, state: AudioStreamState, samples: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode one unit of 16000 samples for a session.

        Returns:
            (embeddings [10, llm_dim], the unit's mel frames [80, F] for inspection).
        """
        mel, reset = self.unit_mel(state, samples)
        x = self.unit_stem(mel[None], first=state.units == 0)  # [1, 50, d]
        if reset:
            state.kv = None
        states, state.kv = self.apm.encode(x, state.kv)
        state.units += 1
        return self._project(states), mel
