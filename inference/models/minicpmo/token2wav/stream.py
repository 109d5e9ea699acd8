"""Streaming Token2Wav: flow + HiFT chunk by chunk, with the reference's caches and cross-fade.

``Token2WavStream`` is one session's state (flow caches from the voice prompt, HiFT's mel / source / speech
tails, the HiFT call count that seeds its noise); ``Token2WavModel`` holds the weights and serves any
number of sessions. Each chunk's audio is its mel frames x 480 samples: HiFT runs over the last 8 cached mel
frames plus the new ones, the first 3840 samples are cross-faded (Hamming) with the previous chunk's tail,
and the last 3840 are held back for the next chunk (the first chunk is shifted by 3840 samples of silence
instead), except in the last chunk, which returns everything.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from inference.models.minicpmo.token2wav.flow import KEEP_RECENT, CausalFlow, FlowCache
from inference.models.minicpmo.token2wav.hift import SAMPLES_PER_FRAME, HiFT
from inference.models.minicpmo.token2wav.loading import check_asset_dir, load_flow, load_hift

MEL_CACHE = 8  # mel frames HiFT re-reads from the previous chunk (160 ms)
SOURCE_CACHE = MEL_CACHE * SAMPLES_PER_FRAME  # 3840 samples of source and of audio overlap
HIFT_SEED = 1000  # HiFT's noise for call k of a stream comes from seed HIFT_SEED + k
# Streams per batch to begin with. A batch holds its streams' flow caches three times over while it runs (stacked,
# computed, split back): at the published shapes a stream's are about 170 MB, beside an LLM that was given the
# rest of the device. Running out of device memory halves it (``chunk_many``), down to one stream at a time.
MAX_BATCH = 32

logger = logging.getLogger(__name__)


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

    def __init__(
        self,
        flow: CausalFlow,
        hift: HiFT,
        device: str | torch.device = "cpu",
        n_timesteps: int = 5,
        max_batch: int = MAX_BATCH,
    ):
        self.device = torch.device(device)
        self.max_batch = max_batch  # lowered for good when a batch runs out of device memory
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

    def longest_nbytes(self, stream: Token2WavStream) -> int:
        """The most device memory ``stream`` holds between chunks: its caches once a trim keeps the prompt's frames
        and the recent ones (``FlowCache.trim``), and its tails at their full length. A chunk's frames above that
        live only while the chunk runs."""
        frames = stream.prompt.mel.shape[1] + KEEP_RECENT
        tails = (stream.mel_tail.shape[1] * MEL_CACHE + 2 * SOURCE_CACHE) * stream.mel_tail.element_size()
        return stream.flow.nbytes_at(frames) + tails

    def chunk(self, stream: Token2WavStream, tokens: list[int], *, last: bool) -> tuple[np.ndarray, torch.Tensor]:
        """Audio (float32, 24 kHz) and mel frames for one chunk of tokens; updates ``stream``."""
        return self.chunk_many([stream], [tokens], [last])[0]

    @torch.inference_mode()
    def chunk_many(
        self, streams: list[Token2WavStream], token_lists: list[list[int]], lasts: list[bool]
    ) -> list[tuple[np.ndarray, torch.Tensor]]:
        """One chunk for each of several streams: per stream what ``chunk`` gives, each stream updated as by it.

        Streams whose tensors line up (``batch_key``) run as one batch: on a GPU batch-1 kernels are launch-bound,
        so a batch costs little more than one stream. The rest (other cache lengths, another ``last``) run apart.
        """
        if len({id(s) for s in streams}) != len(streams):
            raise ValueError("a stream can take only one chunk per call")
        groups: dict[tuple, list[int]] = {}
        for i, (stream, tokens, last) in enumerate(zip(streams, token_lists, lasts, strict=True)):
            groups.setdefault(batch_key(stream, tokens, last), []).append(i)
        results: list[tuple[np.ndarray, torch.Tensor]] = [None] * len(streams)  # type: ignore[list-item]
        for members in groups.values():
            done = 0
            while done < len(members):
                part = members[done : done + self.max_batch]
                try:
                    outs = self._chunk_batch_or_nothing(
                        [streams[i] for i in part], [token_lists[i] for i in part], lasts[part[0]]
                    )
                except torch.OutOfMemoryError:
                    if len(part) == 1:
                        raise
                    self.max_batch = len(part) // 2
                    logger.warning(
                        "token2wav.batch_shrunk", extra={"max_batch": self.max_batch, "failed_batch": len(part)}
                    )
                    continue
                for i, out in zip(part, outs, strict=True):
                    results[i] = out
                done += len(part)
        return results

    def _chunk_batch_or_nothing(
        self, streams: list[Token2WavStream], token_lists: list[list[int]], last: bool
    ) -> list[tuple[np.ndarray, torch.Tensor]]:
        """``_chunk_batch``, or, when the device runs out of memory on the way, the streams as they were (their
        fields are replaced, never changed in place, so keeping the old references restores them)."""
        fields = ("flow", "mel_tail", "source_tail", "speech_tail", "calls")
        before = [{name: getattr(s, name) for name in fields} for s in streams]
        try:
            return self._chunk_batch(streams, token_lists, last)
        except torch.OutOfMemoryError:
            for stream, kept in zip(streams, before, strict=True):
                for name, value in kept.items():
                    setattr(stream, name, value)
            raise

    def _chunk_batch(
        self, streams: list[Token2WavStream], token_lists: list[list[int]], last: bool
    ) -> list[tuple[np.ndarray, torch.Tensor]]:
        """One chunk of streams that line up, as one batch: the flow, HiFT, the cross-fade, each stream's tails."""
        first = streams[0].speech_tail.shape[-1] == 0  # the same for every stream of a batch (batch_key)
        mel = self._flow_batch(streams, token_lists, last)
        full = torch.cat([torch.cat([s.mel_tail for s in streams]), mel], dim=2)
        generators = [self._hift_generator(s) for s in streams]
        speech, source = self.hift(full, torch.cat([s.source_tail for s in streams]), generators)
        if not first:
            speech = self._cross_fade(streams, speech)
        for i, s in enumerate(streams):
            s.mel_tail = full[i : i + 1, :, -MEL_CACHE:].clone()
            s.source_tail = source[i : i + 1, :, -SOURCE_CACHE:].clone()
            s.speech_tail = speech[i : i + 1, -SOURCE_CACHE:].clone()
        if not last:  # the tail waits for the next chunk's cross-fade; a first chunk starts with as much silence
            speech = speech[:, :-SOURCE_CACHE]
            if first:
                speech = torch.cat([torch.zeros(len(streams), SOURCE_CACHE, device=self.device), speech], dim=1)
        audio = speech.float().cpu().numpy()  # one copy to the host for the whole batch
        return [(audio[i], mel[i : i + 1]) for i in range(len(streams))]

    def _flow_batch(self, streams: list[Token2WavStream], token_lists: list[list[int]], last: bool) -> torch.Tensor:
        """The streams' mel [b, 80, frames] for their tokens; each stream's flow caches advanced and trimmed."""
        ids = torch.tensor(token_lists, dtype=torch.int32, device=self.device).long()
        spk = torch.cat([s.prompt.spk for s in streams])
        cache = FlowCache.batch([s.flow for s in streams])
        mel, cache = self.flow.chunk(ids, spk, cache, last_chunk=last, n_timesteps=self.n_timesteps)
        for stream, own in zip(streams, cache.unbatch(len(streams)), strict=True):
            own.trim(stream.prompt.mel.shape[1])
            stream.flow = own
        return mel

    def _hift_generator(self, stream: Token2WavStream) -> torch.Generator:
        """The generator of the stream's next HiFT call (its noise depends on the call's index alone)."""
        gen = torch.Generator(device=self.device).manual_seed(HIFT_SEED + stream.calls)
        stream.calls += 1
        return gen

    def _cross_fade(self, streams: list[Token2WavStream], speech: torch.Tensor) -> torch.Tensor:
        """The first 3840 samples faded in over the previous chunk's held-back tail (Hamming halves)."""
        n = SOURCE_CACHE
        w = streams[0].window.to(self.device)  # every stream's window is the same Hamming window
        tails = torch.cat([s.speech_tail[..., -n:] for s in streams])
        speech = speech.clone()
        speech[..., :n] = speech[..., :n] * w[:n] + tails * w[n:]
        return speech


def batch_key(stream: Token2WavStream, tokens: list[int], last: bool) -> tuple:
    """Streams with equal keys can take their chunks as one batch: same token count, same ``last``, same cache
    and tail lengths (so the same noise offset, and all first chunks or none)."""
    tails = (stream.mel_tail.shape, stream.source_tail.shape, stream.speech_tail.shape)
    return (len(tokens), last, stream.flow.shapes(), tails, stream.prompt.spk.shape)
