"""``FastDuplexRunner``: the unit loop over static KV pools, with the decode steps of a tick batched across sessions.

The decisions are ``DuplexRunner``'s own (its ``generate_steps`` generator); only how the feeds run changes.
``generate_many`` advances every session's generator together: each round collects the next id of every
session still deciding and feeds them all in one graphed step, then the speaking sessions' TTS units run as
one batched decode. The ids are chosen on the device and the next step is launched with them before the host
reads them, so the host's share of a step (the read, the decision logic) overlaps the device's. A tick of 16 sessions with 6 speaking costs about as many LLM steps as one speaking
session, not six times as many.

Prefill: each session's deferred finalize (terminator, ``</unit>``) is fed together with its next unit
(``<unit>``, frame, audio) as one run of positions, and the runs of every session go through one padded,
graphed forward per length bucket (audio-only units, 13-15 positions, share one). Feeding the close with the
next unit is exact only while the window does not slide at that close (the next unit must not see what the
slide drops), so a session about to slide finalizes on its own first.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from inference.models.minicpmo.duplex import (
    LENGTH_PENALTY,
    MAX_STEPS_PER_UNIT,
    TEXT_REPETITION_PENALTY,
    TEXT_REPETITION_WINDOW,
    DuplexRunner,
    DuplexSession,
    UnitResult,
    window_bounds,
)
from inference.models.minicpmo.fast.audio import FastAudio
from inference.models.minicpmo.fast.graphs import upload
from inference.models.minicpmo.fast.llm import FastLLM
from inference.models.minicpmo.fast.tts import FastTTS
from inference.models.minicpmo.loading import MiniCPMOParts

DEFAULT_CAPACITY = 8192  # LLM positions per session: ~4 min of audio-only call before the window slides


@dataclasses.dataclass
class StepAhead:
    """A decode step launched before the host read its ids: the jobs it fed, those ids, and its outputs."""

    jobs: list[int]
    tokens: list[int]
    hidden: torch.Tensor | None  # [R, D]
    logits: torch.Tensor | None  # [R, V]


class FastDuplexRunner(DuplexRunner):
    """``DuplexRunner`` over static caches for up to ``num_slots`` live sessions.

    Args:
        parts: the loaded model (shared with any eager runner; only new caches are allocated).
        num_slots: sessions alive at once (each takes one LLM and one TTS slot).
        capacity: LLM positions per session; the sliding window keeps calls inside it.
        max_rows: the most sessions one batched step takes (default ``num_slots``).
        invariant: the LLM, TTS and audio encoder reduce through the row-invariant kernels, as the eager modules
            do once ``use_row_invariant_kernels`` swapped them in (default: on CUDA, where ``load_model`` does).
        **kwargs: passed to ``DuplexRunner`` (``force_listen_count``, window overrides).
    """

    def __init__(
        self,
        parts: MiniCPMOParts,
        *,
        num_slots: int,
        capacity: int = DEFAULT_CAPACITY,
        max_rows: int | None = None,
        invariant: bool | None = None,
        **kwargs,
    ):
        capacity = min(capacity, parts.config.max_position_embeddings)
        rows = max_rows or num_slots
        on_cuda = torch.device(parts.device).type == "cuda"
        invariant = on_cuda if invariant is None else invariant
        fast_llm = FastLLM(parts.llm, num_slots=num_slots, capacity=capacity, max_rows=rows, invariant=invariant)
        fast_tts = FastTTS(parts.tts, num_slots=num_slots, max_rows=rows, invariant=invariant)
        fast_audio = FastAudio(parts.audio, num_slots=num_slots, max_rows=rows, invariant=invariant)
        window_max, window_target = window_bounds(capacity)
        kwargs.setdefault("window_max", window_max)
        kwargs.setdefault("window_target", window_target)
        super().__init__(dataclasses.replace(parts, llm=fast_llm, tts=fast_tts), **kwargs)
        self.fast_llm, self.fast_tts, self.fast_audio = fast_llm, fast_tts, fast_audio
        self._decided: dict[int, tuple[float, int, int]] = {}  # id(session) -> (margin, raw id, chosen id)

    def capture(self, max_kv: int | None = None) -> int:
        """Capture up front (CUDA only), for every row bucket: the decode steps, the LLM prefills of audio units
        (T bucket 16) and omni units (128), the TTS conditions (16, 32) and the audio encoder; returns how many.
        Other shapes (prompts, longer conditions) are captured on first use."""
        llm, tts = self.fast_llm, self.fast_tts
        steps = llm.graphs.capture_all(max_kv) + tts.graphs.capture_all()
        runs = llm.runs.capture_all([16, 128], max_kv) + tts.runs.capture_all([16, 32])
        return steps + runs + self.fast_audio.capture_all()

    def session_bytes(self) -> int:
        """Device bytes one session's preallocated LLM and TTS slots take."""
        return self.fast_llm.pool.bytes_per_slot() + self.fast_tts.pool.bytes_per_slot()

    def new_session(self) -> DuplexSession:
        return DuplexSession(
            llm_cache=self.fast_llm.new_cache(), tts=self.fast_tts.new_state(), audio=self.fast_audio.new_state()
        )

    def prefill_many(self, jobs: list[tuple[DuplexSession, np.ndarray, torch.Tensor | None]]) -> None:
        """``prefill`` for several sessions: one batched, graphed audio encoder forward, then the LLM runs in
        padded, graphed forwards (one per length bucket)."""
        llm, ids = self.fast_llm, self.ids
        if not jobs:
            return
        runs: list[tuple[DuplexSession, torch.Tensor, int]] = []
        units = self.fast_audio.embed_units([s.audio for s, _, _ in jobs], [a for _, a, _ in jobs])  # [n, 10, D]
        for (session, _, frame_embeds), audio_embeds in zip(jobs, units, strict=True):
            close: list[int] = []
            if session.pending_finalize is not None:
                close = self.finalize_ids(session)
                if llm.cache_length(session.llm_cache) + len(close) > self.window_max:
                    self.finalize(session)  # the window slides here: close on its own, as the eager path does
                    close = []
            pieces = [llm.embed_ids([*close, ids.unit])]
            schema: list = [ids.unit]
            if frame_embeds is not None:
                pieces += [llm.embed_ids([ids.image]), frame_embeds.to(self._dtype), llm.embed_ids([ids.image_end])]
                schema += [ids.image, ["img", int(frame_embeds.shape[0])], ids.image_end]
            pieces.append(audio_embeds.to(self._dtype))
            schema.append(["audio", int(audio_embeds.shape[0])])
            session.last_schema = schema
            runs.append((session, torch.cat(pieces), len(close)))
        sessions = [s for s, _, _ in runs]
        starts = [llm.cache_length(s.llm_cache) for s in sessions]
        _, logits = llm.feed_many([s.llm_cache for s in sessions], [r for _, r, _ in runs])  # logits [R, V]
        for row, (session, _, closed) in enumerate(runs):
            if closed:
                self.close_unit(session, starts[row] + closed, slide=False)
            session.pending_logits = logits[row]

    def prefill(self, session: DuplexSession, audio: np.ndarray, frame_embeds: torch.Tensor | None = None) -> list:
        self.prefill_many([(session, audio, frame_embeds)])
        return session.last_schema

    def generate_many(self, jobs: list[tuple[DuplexSession, bool]], *, generate_audio: bool = True) -> list[UnitResult]:
        """Every session's unit decisions in shared decode steps, then one batched TTS decode.

        Each round's ids are chosen on the device (``_decide``), and the next step is launched with them before
        the host has read them (a step *ahead*); the host then reads the ids and runs the decision logic while the
        device runs that step. A session whose logic wants another id (``<|listen|>`` mid-turn becomes
        ``<|tts_bos|>``) is fed again at the same position; one that stops leaves the extra step's keys past its
        cache length, where the next feed overwrites them before anything attends to them. Such a step costs
        the device a whole step (about 8 ms at the real shapes) against the host read it hides (about 0.5 ms),
        so none is launched where the host knows it is wasted: after a session's 19th id of the unit, whose
        20th is ``<|chunk_eos|>`` without a decision.
        """
        results: list = [None] * len(jobs)
        # Sessions that decide (not forced to listen) get their ids chosen for all rows at once (``_decide``).
        deciding = [i for i, (s, force) in enumerate(jobs) if not (force or s.generate_count < self.force_listen_count)]
        steps = [self.generate_steps(session, force_listen=force) for session, force in jobs]
        waiting: dict[int, int] = {}  # job -> id it wants fed
        fed_ids = [0] * len(jobs)  # ids fed to each session in this unit's loop

        def advance(i: int, sent) -> None:
            try:
                waiting[i] = next(steps[i]) if sent is None else steps[i].send(sent)
            except StopIteration as done:
                results[i] = done.value

        ahead = None
        if deciding:
            pending = [jobs[i][0].pending_logits for i in deciding]
            if all(p is not None for p in pending):
                ahead = self._decide(jobs, deciding, torch.stack(pending))
        for i in range(len(jobs)):
            advance(i, None)
        while waiting:
            order = sorted(waiting)
            wanted = {i: waiting.pop(i) for i in order}
            fed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # job -> (hidden [D], logits [V]) of its feed
            if ahead is not None:
                for row, (i, token) in enumerate(zip(ahead.jobs, ahead.tokens, strict=True)):
                    if wanted.get(i) == token:  # the step ahead fed what the session wants: keep it
                        self.fast_llm.accept_ahead(jobs[i][0].llm_cache)
                        fed[i] = (ahead.hidden[row], ahead.logits[row])
            fresh = [i for i in order if i not in fed]
            if fresh:
                hidden, logits = self.fast_llm.feed_tokens(
                    [jobs[i][0].llm_cache for i in fresh], [wanted[i] for i in fresh]
                )
                hidden, logits = hidden.clone(), logits.clone()  # kept past the next step's static buffers
                for row, i in enumerate(fresh):
                    fed[i] = (hidden[row], logits[row])
            for i in order:
                fed_ids[i] += 1
            # a session that has fed MAX_STEPS_PER_UNIT - 1 ids ends the unit without deciding again
            rows = [i for i in order if i in deciding and fed_ids[i] < MAX_STEPS_PER_UNIT - 1]
            ahead = self._decide(jobs, rows, torch.stack([fed[i][1] for i in rows])) if rows else None
            for i in order:
                advance(i, fed[i])
        self._decided.clear()
        speaking = [i for i, (_, speak) in enumerate(results) if speak is not None and generate_audio]
        if speaking:
            plans = [self.speak_begin(jobs[i][0], results[i][1]) for i in speaking]
            codes = self.fast_tts.generate_units(
                [jobs[i][0].tts for i in speaking], [c for c, _ in plans], [m for _, m in plans]
            )
            for i, unit_codes in zip(speaking, codes, strict=True):
                results[i][0].tts_codes = unit_codes
                self.speak_end(jobs[i][0], results[i][1])
        return [result for result, _ in results]

    def _decide(self, jobs: list[tuple[DuplexSession, bool]], rows: list[int], logits: torch.Tensor) -> StepAhead:
        """``DuplexRunner._decode``'s arithmetic for jobs ``rows`` (logits [R, V]) at once, then the step ahead.

        The same elementwise operations on the same float32 values, so the chosen ids and margins are those of
        the per-session decode; ``_decode`` then only books them. The decisions come back in one copy, read
        after the step ahead is launched, so the device runs that step while the host waits for the copy.
        """
        sessions = [jobs[i][0] for i in rows]
        top2 = torch.topk(logits, 2, dim=-1).values  # [R, 2]
        raw = torch.argmax(logits, dim=-1)
        scores = logits.clone()
        scores[:, self.banned] = -torch.inf
        seen_rows, seen_ids = [], []
        for r, session in enumerate(sessions):
            history = set(session.generated_tokens[-TEXT_REPETITION_WINDOW:])
            seen_rows += [r] * len(history)
            seen_ids += sorted(history)
        if seen_ids:
            index = upload([seen_rows, seen_ids], scores.device)
            seen = torch.zeros_like(scores, dtype=torch.bool)
            seen[index[0], index[1]] = True
            scores = torch.where(seen, scores / TEXT_REPETITION_PENALTY, scores)
        eos = scores[:, self.ids.turn_eos]
        scores[:, self.ids.turn_eos] = torch.where(eos > 0, eos / LENGTH_PENALTY, eos * LENGTH_PENALTY)
        chosen = torch.argmax(scores, dim=-1)  # first maximum: ties go to the lowest id
        # float64 holds the float32 margin and the ids (< 2**24) exactly
        decided = torch.stack([(top2[:, 0] - top2[:, 1]).double(), raw.double(), chosen.double()])  # [3, R]
        on_cuda = decided.device.type == "cuda"
        host = torch.empty(decided.shape, dtype=decided.dtype, pin_memory=on_cuda)
        host.copy_(decided, non_blocking=on_cuda)
        copied = torch.cuda.Event() if on_cuda else None
        if copied is not None:
            copied.record()
        # The id each session most likely feeds next (``_decode`` returns the raw id when it is chunk_eos).
        next_ids = torch.where(raw == self.ids.chunk_eos, raw, chosen)
        room = [r for r, s in enumerate(sessions) if s.llm_cache.length < self.fast_llm.capacity]
        hidden = logits_ahead = None
        if room:
            index = torch.tensor(room, device=next_ids.device) if len(room) < len(rows) else None
            tokens = next_ids if index is None else next_ids.index_select(0, index)
            hidden, logits_ahead = self.fast_llm.step_ahead([sessions[r].llm_cache for r in room], tokens)
        if copied is not None:
            copied.synchronize()
        margins, raws, chosens = host.tolist()
        for r, session in enumerate(sessions):
            self._decided[id(session)] = (margins[r], int(raws[r]), int(chosens[r]))
        next_host = [int(raws[r]) if int(raws[r]) == self.ids.chunk_eos else int(chosens[r]) for r in room]
        return StepAhead([rows[r] for r in room], next_host, hidden, logits_ahead)

    def _decode(self, session: DuplexSession, logits: torch.Tensor, margins: list[float]) -> int:
        """The id ``_decide`` chose for this session's current logits (the eager decode when none was)."""
        decided = self._decided.pop(id(session), None)
        if decided is None:
            return super()._decode(session, logits, margins)
        margin, raw, chosen = decided
        margins.append(margin)
        if raw == self.ids.chunk_eos:
            return raw
        session.generated_tokens.append(chosen)
        return chosen

    @property
    def _dtype(self) -> torch.dtype:
        return self.fast_llm.llm.model.embed_tokens.weight.dtype
