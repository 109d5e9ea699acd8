"""Streaming Token2Wav: flow + HiFT chunk by chunk, with the reference's caches and cross-fade.

``Token2WavStream`` is one session's state (flow caches from the voice prompt, HiFT's mel / source / speech
tails, the HiFT call count that seeds its noise); ``Token2WavModel`` holds the weights and serves any
number of sessions. Each chunk's audio is its mel frames x 480 samples: HiFT runs over the last 8 cached mel
frames plus the new ones, the first 3840 samples are cross-faded (Hamming) with the previous chunk's tail,
and the last 3840 are held back for the next chunk (the first chunk is shifted by 3840 samples of silence
instead), except in the last chunk, which returns everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from inference.models.minicpmo.token2wav.flow import CausalFlow, FlowCache
from inference.models.minicpmo.token2wav.hift import SAMPLES_PER_FRAME, HiFT
from inference.models.minicpmo.token2wav.loading import check_asset_dir, load_flow, load_hift

MEL_CACHE = 8  # mel frames HiFT re-reads from the previous chunk (160 ms)
SOURCE_CACHE = MEL_CACHE * SAMPLES_PER_FRAME  # 3840 samples of source and of audio overlap
HIFT_SEED = 1000  # HiFT's noise for call k of a stream comes from seed HIFT_SEED + k


@dataclass
class PromptFeatures:
    """The voice prompt as the flow needs it: tokens [1, T], speaker embedding [1, 192], mel [1, 2T, 80]."""

    tokens: torch.Tensor
    spk: torch.Tensor
    mel: torch.Tensor


@dataclass
class Token2WavStream:
    """One session's streaming state."""

    prompt: PromptFeatures
    flow: FlowCache
    mel_tail: torch.Tensor
    source_tail: torch.Tensor
    speech_tail: torch.Tensor
    calls: int = 0
    window: torch.Tensor = field(default_factory=lambda: torch.from_numpy(np.hamming(2 * SOURCE_CACHE)))

    def fork(self) -> Token2WavStream:
        """An independent copy (a new turn starts from the prompt's stream)."""
        return Token2WavStream(
            self.prompt,
            self.flow.clone(),
            self.mel_tail.clone(),
            self.source_tail.clone(),
            self.speech_tail.clone(),
            self.calls,
            self.window,
        )

    def nbytes(self) -> int:
        return self.flow.nbytes() + sum(
            t.numel() * t.element_size() for t in (self.mel_tail, self.source_tail, self.speech_tail)
        )


class Token2WavModel:
    """Flow + HiFT on one device, float32."""

    SILENCE_TOKEN = 4218

    def __init__(self, flow: CausalFlow, hift: HiFT, device: str | torch.device = "cpu", n_timesteps: int = 5):
        self.device = torch.device(device)
        self.flow = flow.to(self.device).eval()
        self.hift = hift.to(self.device).eval()
        self.n_timesteps = n_timesteps
        self.lookahead = flow.pre_lookahead_len

    @classmethod
    def load(cls, asset_dir: str | Path, device: str | torch.device = "cpu", n_timesteps: int = 5) -> Token2WavModel:
        asset_dir = Path(asset_dir)
        check_asset_dir(asset_dir)
        return cls(load_flow(asset_dir), load_hift(asset_dir), device, n_timesteps)

    def start(self, prompt: PromptFeatures) -> Token2WavStream:
        """Prime a stream with the prompt (plus 3 silence tokens of look-ahead)."""
        d = self.device
        tokens = prompt.tokens.to(d)
        pad = torch.full((1, self.lookahead), self.SILENCE_TOKEN, dtype=tokens.dtype, device=d)
        cache = self.flow.setup(torch.cat([tokens, pad], dim=1), prompt.mel.to(d), prompt.spk.to(d), self.n_timesteps)
        p = PromptFeatures(tokens, prompt.spk.to(d), prompt.mel.to(d))
        return Token2WavStream(
            prompt=p,
            flow=cache,
            mel_tail=torch.zeros(1, prompt.mel.shape[2], 0, device=d),
            source_tail=torch.zeros(1, 1, 0, device=d),
            speech_tail=torch.zeros(1, 0, device=d),
        )

    @torch.inference_mode()
    def chunk(self, stream: Token2WavStream, tokens: list[int], *, last: bool) -> tuple[np.ndarray, torch.Tensor]:
        """Audio (float32, 24 kHz) and mel frames for one chunk of tokens; updates ``stream``."""
        ids = torch.tensor([tokens], dtype=torch.int32, device=self.device).long()
        mel, stream.flow = self.flow.chunk(
            ids, stream.prompt.spk, stream.flow, last_chunk=last, n_timesteps=self.n_timesteps
        )
        stream.flow.trim(stream.prompt.mel.shape[1])
        full = torch.cat([stream.mel_tail, mel], dim=2)
        gen = torch.Generator(device=self.device).manual_seed(HIFT_SEED + stream.calls)
        stream.calls += 1
        speech, source = self.hift(full, stream.source_tail, generator=gen)
        first = stream.speech_tail.shape[-1] == 0
        if not first:
            n = SOURCE_CACHE
            w = stream.window.to(self.device)
            speech = speech.clone()
            speech[..., :n] = speech[..., :n] * w[:n] + stream.speech_tail[..., -n:] * w[n:]
        stream.mel_tail = full[..., -MEL_CACHE:].clone()
        stream.source_tail = source[:, :, -SOURCE_CACHE:].clone()
        stream.speech_tail = speech[:, -SOURCE_CACHE:].clone()
        if not last:
            if first:
                speech = torch.cat([torch.zeros(1, SOURCE_CACHE, device=self.device), speech[:, :-SOURCE_CACHE]], dim=1)
            else:
                speech = speech[:, :-SOURCE_CACHE]
        return speech[0].float().cpu().numpy(), mel
