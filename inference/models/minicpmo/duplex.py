"""The MiniCPM-o 4.5 full-duplex unit loop: prepare, then per 1 s unit prefill -> generate -> finalize.

``DuplexSession`` is everything one call owns (LLM cache, audio stream state, TTS state, decoding history);
``DuplexRunner`` holds the loaded model and drives any number of sessions in turn, so one model instance
serves several calls. Finalize is deferred: ``generate`` leaves the terminator pending and the next
``prefill`` (or an explicit ``finalize``) feeds it with ``</unit>``.

Long calls: once the LLM cache passes ``window_max`` positions the oldest whole units after the prompt are
dropped (keys re-rotated, see ``DuplexLLM.drop_span``) until it is back under ``window_target``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from inference.models.minicpmo.audio_encoder import AudioStreamState
from inference.models.minicpmo.loading import MiniCPMOParts
from inference.models.minicpmo.tts import MIN_NEW_CODES, TTSState

MAX_STEPS_PER_UNIT = 20  # max_new_speak_tokens_per_chunk: at most 19 ids are decided per unit
MAX_UNIT_CHARS = 28
FORCE_LISTEN_COUNT = 3
TEXT_REPETITION_PENALTY = 1.05
TEXT_REPETITION_WINDOW = 512
LENGTH_PENALTY = 1.1  # on <|turn_eos|>


def window_bounds(max_positions: int) -> tuple[int, int]:
    """(length that triggers the sliding window, length it shrinks to) for an LLM context size.

    The trigger leaves room for one more omni unit; shrinking by ~1k positions at a time keeps the
    re-rotation rare (every ~30-80 s of call) instead of once per unit.
    """
    window_max = max_positions - 256
    return window_max, max(window_max // 2, window_max - 1024)


@dataclass(frozen=True)
class SpecialIds:
    """Token ids the loop uses, looked up in the tokenizer."""

    im_start: int
    im_end: int
    unit: int
    unit_end: int
    image: int
    image_end: int
    audio_start: int
    audio_end: int
    tts_bos: int
    listen: int
    speak: int
    turn_eos: int
    chunk_eos: int
    chunk_tts_eos: int
    tts_pad: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> SpecialIds:
        names = {
            "im_start": "<|im_start|>",
            "im_end": "<|im_end|>",
            "unit": "<unit>",
            "unit_end": "</unit>",
            "image": "<image>",
            "image_end": "</image>",
            "audio_start": "<|audio_start|>",
            "audio_end": "<|audio_end|>",
            "tts_bos": "<|tts_bos|>",
            "listen": "<|listen|>",
            "speak": "<|speak|>",
            "turn_eos": "<|turn_eos|>",
            "chunk_eos": "<|chunk_eos|>",
            "chunk_tts_eos": "<|chunk_tts_eos|>",
            "tts_pad": "<|tts_pad|>",
        }
        return cls(**{field_: int(tokenizer.convert_tokens_to_ids(tok)) for field_, tok in names.items()})


@dataclass
class UnitResult:
    """What one unit decided (the golden.json per-unit record, plus audio codes)."""

    unit: int
    prefill_schema: list
    is_listen: bool
    end_of_turn: bool
    llm_ids: list[int]
    text: str
    tts_codes: list[int]
    raw_top2_margins: list[float]
    kv_len: int | None = None  # filled by finalize


@dataclass
class SpeakRequest:
    """What a speaking unit hands the TTS: its text ids, their LLM hidden states, and whether the turn ended."""

    text_ids: list[int]
    text_hidden: list[torch.Tensor]
    end_of_turn: bool


UnitSteps = Generator[int, tuple[torch.Tensor, torch.Tensor], tuple[UnitResult, SpeakRequest | None]]


def drive(steps: UnitSteps, feed: Callable[[int], tuple[torch.Tensor, torch.Tensor]]) -> tuple:
    """Run a ``generate_steps`` generator to its end, feeding each id it yields through ``feed``."""
    try:
        token = next(steps)
        while True:
            token = steps.send(feed(token))
    except StopIteration as done:
        return done.value


@dataclass
class DuplexSession:
    """Everything one call owns. Dropping the object frees every byte it took."""

    llm_cache: DynamicCache
    audio: AudioStreamState = field(default_factory=AudioStreamState)
    tts: TTSState = field(default_factory=TTSState)
    turn_ended: bool = True
    generate_count: int = 0
    generated_tokens: list[int] = field(default_factory=list)
    units: int = 0
    prompt_length: int = 0
    pending_logits: torch.Tensor | None = None
    pending_finalize: list[int] | None = None  # ids to feed before </unit>, or [] for </unit> alone
    pending_result: UnitResult | None = None
    unit_spans: deque[int] = field(default_factory=deque)  # LLM positions taken by each remembered unit
    dropped_units: int = 0
    last_schema: list = field(default_factory=list)

    def nbytes(self) -> int:
        """Tensor bytes held by this session's caches."""
        total = self.audio.nbytes() + self.tts.nbytes()
        for layer in getattr(self.llm_cache, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total


class DuplexRunner:
    """Drives the unit loop for any number of sessions over one loaded model.

    Args:
        parts: the loaded model.
        force_listen_count: units forced to listen at the start of a call.
        window_max: LLM cache length that triggers the sliding window.
        window_target: length the window shrinks the cache to.
    """

    def __init__(
        self,
        parts: MiniCPMOParts,
        *,
        force_listen_count: int = FORCE_LISTEN_COUNT,
        window_max: int | None = None,
        window_target: int | None = None,
    ):
        self.parts = parts
        self.tok = parts.tokenizer
        self.ids = SpecialIds.from_tokenizer(parts.tokenizer)
        self.force_listen_count = force_listen_count
        default_max, default_target = window_bounds(parts.config.max_position_embeddings)
        self.window_max = window_max if window_max is not None else default_max
        self.window_target = window_target if window_target is not None else default_target
        vocab = parts.config.vocab_size
        banned = [i for i in [self.ids.tts_pad, self.ids.chunk_eos, *parts.bad_token_ids] if 0 <= i < vocab]
        self.banned = torch.tensor(sorted(set(banned)), dtype=torch.long, device=parts.device)
        self.terminators = {self.ids.listen, self.ids.chunk_eos, self.ids.chunk_tts_eos}

    # -- prepare -------------------------------------------------------------------------------------------

    def prompt_ids(self, system_prompt: str) -> tuple[list[int], list[int]]:
        """The two prepare token lists around the reference-audio embeddings."""
        # The persona is user text: control tokens spelled inside it stay plain text, never specials.
        body = self.tok.encode(f"system\n{system_prompt}\n", add_special_tokens=False, split_special_tokens=True)
        return [self.ids.im_start, *body, self.ids.audio_start], [self.ids.audio_end, self.ids.im_end]

    def new_session(self) -> DuplexSession:
        """An empty session (call ``prepare`` next)."""
        return DuplexSession(llm_cache=self.parts.llm.new_cache())

    def prepare(self, session: DuplexSession, system_prompt: str, ref_audio: np.ndarray | None) -> int:
        """Feed the system prompt and the LLM reference audio; returns the cache length (30 for 2 s)."""
        llm = self.parts.llm
        prefix, suffix = self.prompt_ids(system_prompt)
        llm.feed(session.llm_cache, llm.embed_ids(prefix))
        if ref_audio is not None:
            ref = self.parts.audio.embed_reference(np.asarray(ref_audio, dtype=np.float32))
            llm.feed(session.llm_cache, ref.to(self._dtype))
        llm.feed(session.llm_cache, llm.embed_ids(suffix))
        session.prompt_length = llm.cache_length(session.llm_cache)
        return session.prompt_length

    @property
    def _dtype(self) -> torch.dtype:
        return self.parts.llm.llm.model.embed_tokens.weight.dtype

    # -- per unit -------------------------------------------------------------------------------------------

    def prefill(self, session: DuplexSession, audio: np.ndarray, frame_embeds: torch.Tensor | None = None) -> list:
        """Feed ``<unit>``, the optional frame and the unit's 10 audio embeddings (finalizing first)."""
        self.finalize(session)
        llm = self.parts.llm
        audio_embeds, _ = self.parts.audio.embed_unit(session.audio, np.asarray(audio, dtype=np.float32))
        schema: list = [self.ids.unit]
        llm.feed(session.llm_cache, llm.embed_ids([self.ids.unit]))
        if frame_embeds is not None:
            llm.feed(session.llm_cache, llm.embed_ids([self.ids.image]))
            llm.feed(session.llm_cache, frame_embeds.to(self._dtype))
            llm.feed(session.llm_cache, llm.embed_ids([self.ids.image_end]))
            schema += [self.ids.image, ["img", int(frame_embeds.shape[0])], self.ids.image_end]
        hidden = llm.feed(session.llm_cache, audio_embeds.to(self._dtype))
        schema.append(["audio", int(audio_embeds.shape[0])])
        session.pending_logits = llm.logits(hidden[-1])
        session.last_schema = schema
        return schema

    def prefill_many(self, jobs: list[tuple[DuplexSession, np.ndarray, torch.Tensor | None]]) -> None:
        """``prefill`` for several (session, audio, frame embeddings) triples; the fast runner batches them."""
        for session, audio, frame_embeds in jobs:
            self.prefill(session, audio, frame_embeds)

    def _decode(self, session: DuplexSession, logits: torch.Tensor, margins: list[float]) -> int:
        """Greedy decode with the reference's masks and penalties (§4.2 of the golden README)."""
        top2 = torch.topk(logits, 2).values
        margins.append(float(top2[0] - top2[1]))
        raw = int(torch.argmax(logits))
        if raw == self.ids.chunk_eos:
            return raw
        scores = logits.clone()
        scores[self.banned] = -torch.inf
        history = session.generated_tokens[-TEXT_REPETITION_WINDOW:]
        if history:
            seen = torch.tensor(sorted(set(history)), dtype=torch.long, device=scores.device)
            scores[seen] = scores[seen] / TEXT_REPETITION_PENALTY
        eos = self.ids.turn_eos
        scores[eos] = scores[eos] / LENGTH_PENALTY if scores[eos] > 0 else scores[eos] * LENGTH_PENALTY
        chosen = int(torch.argmax(scores))  # first maximum: ties go to the lowest id
        session.generated_tokens.append(chosen)
        return chosen

    def generate(
        self, session: DuplexSession, *, force_listen: bool = False, generate_audio: bool = True
    ) -> UnitResult:
        """Decide listen or speak for the unit just prefilled; the terminator stays pending for finalize."""
        result, speak = drive(self.generate_steps(session, force_listen=force_listen), self._feed_one(session))
        if speak is not None and generate_audio:
            result.tts_codes = self._speak(session, speak)
        return result

    def generate_many(self, jobs: list[tuple[DuplexSession, bool]], *, generate_audio: bool = True) -> list[UnitResult]:
        """``generate`` for several (session, force_listen) pairs; the fast runner batches their steps."""
        return [self.generate(s, force_listen=f, generate_audio=generate_audio) for s, f in jobs]

    def _feed_one(self, session: DuplexSession):
        llm = self.parts.llm

        def feed(token: int) -> tuple[torch.Tensor, torch.Tensor]:
            hidden = llm.feed(session.llm_cache, llm.embed_ids([token]))[-1]
            return hidden, llm.logits(hidden)

        return feed

    def generate_steps(self, session: DuplexSession, *, force_listen: bool = False) -> UnitSteps:
        """The decision loop of one unit as a generator: it yields each id to feed and is sent back that
        feed's (final-normed hidden [D], float logits [V]); it returns (result, what to speak or None).

        Written once so that the eager path (one session, one feed at a time) and the fast path (one
        batched step over every session's next id) run the same decisions.
        """
        if session.pending_logits is None:
            raise RuntimeError("generate() needs a prefill() first")
        ids = self.ids
        logits, session.pending_logits = session.pending_logits, None
        forced = session.generate_count < self.force_listen_count or force_listen
        session.generate_count += 1
        unit_ids: list[int] = []
        margins: list[float] = []
        text_ids: list[int] = []
        text_hidden: list[torch.Tensor] = []
        end_of_turn = False
        if force_listen and not session.turn_ended:
            # Forced close of a speaking turn: the TTS cache is deliberately kept (reference behaviour).
            _, logits = yield ids.turn_eos
            unit_ids.append(ids.turn_eos)
            session.turn_ended = True
        terminator: int | None = None
        for j in range(MAX_STEPS_PER_UNIT):
            if j == MAX_STEPS_PER_UNIT - 1:
                terminator = ids.chunk_eos
                unit_ids.append(terminator)
                break
            if forced:
                token = ids.listen
            else:
                token = self._decode(session, logits, margins)
                if token == ids.listen and not session.turn_ended:
                    token = ids.tts_bos  # the model cannot yield mid-turn
            unit_ids.append(token)
            if token in self.terminators:
                terminator = token
                break
            session.turn_ended = False
            if j > 0:
                text = self.tok.decode([*text_ids, token], skip_special_tokens=True)
                if len(text) >= MAX_UNIT_CHARS:
                    unit_ids[-1] = ids.chunk_eos  # the capped id is never fed
                    terminator = ids.chunk_eos
                    break
            hidden, logits = yield token
            if token == ids.turn_eos:
                session.turn_ended = True
                end_of_turn = True
            if j > 0:
                text_ids.append(token)
                text_hidden.append(hidden)
        is_listen = terminator == ids.listen
        session.pending_finalize = [] if terminator is None else [terminator]
        result = UnitResult(
            unit=session.units,
            prefill_schema=session.last_schema,
            is_listen=is_listen,
            end_of_turn=False if is_listen else end_of_turn,
            llm_ids=unit_ids,
            text="" if is_listen else self.tok.decode(text_ids, skip_special_tokens=True),
            tts_codes=[],
            raw_top2_margins=margins,
        )
        session.units += 1
        session.pending_result = result
        return result, (None if is_listen else SpeakRequest(text_ids, text_hidden, end_of_turn))

    def _speak(self, session: DuplexSession, speak: SpeakRequest) -> list[int]:
        condition, min_codes = self.speak_begin(session, speak)
        codes = self.parts.tts.generate_unit(session.tts, condition, min_codes)
        self.speak_end(session, speak)
        return codes

    def speak_begin(self, session: DuplexSession, speak: SpeakRequest) -> tuple[torch.Tensor, int]:
        """The TTS condition of a speaking unit and its minimum code count (may start a fresh TTS turn)."""
        tts = self.parts.tts
        hidden = torch.stack(speak.text_hidden) if speak.text_hidden else None
        condition = tts.condition(speak.text_ids, hidden)
        min_codes = 0 if (session.tts.pos == 0 or speak.end_of_turn) else MIN_NEW_CODES
        # Very long turns would run the TTS past its positions; start a fresh TTS turn instead.
        if session.tts.pos + condition.shape[0] + MIN_NEW_CODES >= tts.cfg.max_position_embeddings:
            session.tts.reset()
        return condition, min_codes

    @staticmethod
    def speak_end(session: DuplexSession, speak: SpeakRequest) -> None:
        if speak.end_of_turn:
            session.tts.reset()

    def finalize(self, session: DuplexSession) -> UnitResult | None:
        """Feed the pending terminator with ``</unit>``; no-op when nothing is pending."""
        if session.pending_finalize is None:
            return None
        llm = self.parts.llm
        llm.feed(session.llm_cache, llm.embed_ids(self.finalize_ids(session)))
        return self.close_unit(session, llm.cache_length(session.llm_cache), slide=True)

    def finalize_ids(self, session: DuplexSession) -> list[int]:
        """The ids that close the pending unit (its terminator, if any, and ``</unit>``)."""
        assert session.pending_finalize is not None, "no unit is pending"
        return [*session.pending_finalize, self.ids.unit_end]

    def close_unit(self, session: DuplexSession, end: int, *, slide: bool) -> UnitResult | None:
        """Book-keeping once ``finalize_ids`` are in the cache, ending at position ``end``.

        ``slide`` applies the sliding window; the fast path, which feeds the close together with the next
        unit, closes without it, and only when ``end`` is within the window (see ``FastDuplexRunner``).
        """
        session.pending_finalize = None
        result, session.pending_result = session.pending_result, None
        if result is not None:
            result.llm_ids.append(self.ids.unit_end)
        # The unit spans from its <unit> to its </unit>: everything fed since the previous finalize.
        previous_end = session.prompt_length + sum(session.unit_spans)
        session.unit_spans.append(end - previous_end)
        if slide:
            self._enforce_window(session)
            end = self.parts.llm.cache_length(session.llm_cache)
        if result is not None:
            result.kv_len = end
        return result

    def _enforce_window(self, session: DuplexSession) -> None:
        llm = self.parts.llm
        length = llm.cache_length(session.llm_cache)
        if length <= self.window_max:
            return
        drop = 0
        while session.unit_spans and length - drop > self.window_target and len(session.unit_spans) > 1:
            drop += session.unit_spans.popleft()
            session.dropped_units += 1
        llm.drop_span(session.llm_cache, session.prompt_length, drop)
