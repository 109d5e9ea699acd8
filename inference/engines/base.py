"""The engine contract that every model family implements.

An engine owns one model instance on one device and serves ``num_slots`` sessions as slots.
It is only ever touched from its worker thread (``inference.slots.worker``), so engines need no locks.

Lifecycle of a slot, as the worker drives it::

    open_slot(i, config)      # allocate per-slot state; may queue a prefill (persona, voice)
    step({i: SlotInput, ...}) # every tick; a slot absent from the mapping is frozen (not fed silence)
    ...                       # while a slot is prefilling, step() advances its prefill and returns
                              # SlotOutput(prefilling=True, progress=...) for it
    close_slot(i)             # free everything the slot took; returns only once cleanup is done

Lockstep engines (Moshi, PersonaPlex) take one 80 ms frame per tick per slot and return one.
Unit engines (MiniCPM-o) take one 1 s unit per tick and decide to listen or speak. The worker
does not care which: it ticks every ``capabilities.chunk_period_ms`` and hands each live slot
exactly ``capabilities.input_chunk_samples`` samples at ``capabilities.input_rate``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

# The capabilities and voice types live in the leaf ``inference.contracts``; engines take them from here.
from inference.contracts import ChatMessage, EngineCapabilities, VoiceRef

Decision = Literal["listen", "speak"]
# Turn-based modes (half-duplex, chat) hold a unit engine to a side: "listen" forces every unit to listen,
# "respond" makes the model answer (it may not yield the turn until it ends it); "free" is full duplex.
SlotTurn = Literal["free", "listen", "respond"]
ProgressFn = Callable[[float, str], None]
"""Called with (fraction done in [0, 1], human-readable stage) during long work."""


@dataclass(frozen=True)
class SlotConfig:
    """Everything fixed for a slot's lifetime. Persona and voice are immutable once audio starts."""

    persona: str | None = None  # persona / system-prompt text, without tags
    voice: VoiceRef | None = None
    seed: int | None = None


@dataclass
class SlotInput:
    """One tick's input for one slot."""

    audio: np.ndarray  # float32 [capabilities.input_chunk_samples], mono, in [-1, 1]
    image: bytes | None = None  # one camera frame (JPEG/PNG bytes) for omni engines, else None
    force_listen: bool = False  # unit engines: this unit must listen
    turn: SlotTurn = "free"  # unit engines in turn-based modes: see SlotTurn


@dataclass
class SlotOutput:
    """One tick's output for one slot."""

    audio: np.ndarray  # float32 mono at capabilities.output_rate; may be empty while prefilling
    text: str = ""  # transcript delta (the model's own text)
    decision: Decision | None = None  # unit engines: listen or speak this unit
    end_of_turn: bool = False
    cut_off: bool = False  # chat replies: it ended at the reply's length cap (the response is incomplete)
    prefilling: bool = False  # True while the slot's prefill is still running
    progress: float = 1.0  # prefill progress in [0, 1]
    # the agent's tokens this step when the engine has them (lockstep: text token, then one per audio codebook):
    # recorded, so a replay can be compared token for token
    tokens: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ChatRequest:
    """Chat mode: the whole conversation so far, to be answered by the engine (the slot keeps nothing)."""

    messages: tuple[ChatMessage, ...]
    persona: str | None = None
    voice: VoiceRef | None = None
    max_tokens: int = 128  # the reply's text is cut here


@dataclass(frozen=True)
class EngineCapacity:
    """Sessions the engine admits, as its memory is laid out: what the console sets the calls held against.

    Attributes:
        slots: the batch's slots (a hard ceiling).
        full_context: sessions it admits with every one at its full context.
        call_mix: sessions it holds at the call-length mix it plans for (paged KV); ``full_context`` when a
            session's memory does not grow during a call.
        mean_call_s: the mix's mean call length; None when there is no mix to plan for.
    """

    slots: int
    full_context: int
    call_mix: int
    mean_call_s: float | None = None

    @classmethod
    def by_slots(cls, slots: int) -> EngineCapacity:
        return cls(slots, slots, slots)


class EngineError(Exception):
    """The engine could not do what was asked; the session using the slot must end (engine_failed)."""


class Engine(abc.ABC):
    """A model instance serving several sessions as slots of one batch."""

    capabilities: EngineCapabilities
    num_slots: int

    @abc.abstractmethod
    def warmup(self, progress: ProgressFn | None = None) -> None:
        """Load weights and run the hot path once so the first real tick is fast."""

    @abc.abstractmethod
    def open_slot(self, slot: int, config: SlotConfig) -> None:
        """Prepare ``slot`` for a new session. Heavy prefill work should be spread over step() calls."""

    def live_at_open(self, slot: int) -> bool:
        """True when ``slot`` opened with nothing to prefill (no prompt, or a prefill-cache hit).

        Such a slot takes input from its very first tick, so the caller's first audio comes back a tick
        sooner; otherwise the first tick prepares the slot and input starts with the next one.
        """
        return False

    def prepare_start(self, config: SlotConfig) -> bool:
        """Do a session start's one-off work for ``config`` ahead of any session (warm start, on an idle engine).

        Engines that cache the state after a start (the lockstep prefill cache) fill it here, so the first
        session with ``config`` starts live. Returns whether anything was kept; by default nothing is.
        """
        return False

    @abc.abstractmethod
    def close_slot(self, slot: int) -> None:
        """Release everything ``slot`` holds. Returning means cleanup is confirmed."""

    @abc.abstractmethod
    def step(self, inputs: Mapping[int, SlotInput]) -> dict[int, SlotOutput]:
        """Advance the given slots by one tick; slots not in ``inputs`` stay frozen.

        Slots still prefilling may be absent from ``inputs``: the engine advances their prefill
        anyway and reports them with ``prefilling=True``. Must not block on host I/O.
        """

    def cancel(self, slot: int) -> None:  # noqa: B027 - optional hook, no-op by default
        """Barge-in: stop the current utterance of ``slot`` (unit engines end their speak turn)."""

    def chat(self, slot: int, request: ChatRequest) -> Iterator[SlotOutput]:
        """Chat mode: answer ``request`` on ``slot`` (not opened with ``open_slot``), piece by piece.

        The worker advances the iterator between ticks; every piece carries text and audio, the last one
        ``end_of_turn=True``. Closing the iterator early (a cancelled response) frees what it took.
        """
        raise EngineError(f"engine {self.capabilities.engine!r} serves no chat")

    def memory_snapshot(self) -> dict[str, float]:
        """Optional device-memory figures for the occupancy view (bytes)."""
        return {}

    def capacity(self) -> EngineCapacity:
        """Sessions this engine admits (its slots, unless its memory admits fewer at the mix it plans for)."""
        return EngineCapacity.by_slots(self.num_slots)

    def admissible_sessions(self) -> int | None:
        """How many more sessions memory admits now, besides free slots; None when only slots limit it
        (engines whose per-session memory grows during a call, like paged KV, ration admission here)."""
        return None
