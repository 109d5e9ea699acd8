"""What a ``DialogueSession`` knows of the rest of the service: narrow interfaces and shared settings.

The session imports neither the worker, the pool, the handle nor the service; it sees them only
through the protocols here, bundled per service into one ``SessionContext``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from inference.config import InferenceConfig
from inference.contracts import EngineCapabilities
from inference.engines.base import ChatRequest, SlotConfig, SlotTurn
from inference.recording.policy import RecordingPolicy
from inference.recording.recorder import SessionRecording
from inference.session.outbox import Outbox
from inference.slots.chats import ChatListener
from inference.slots.delivery import SlotListener
from inference.slots.pool import Applicant
from inference.slots.worker import SlotCounters, WorkerStats


class SlotDriver(Protocol):
    """The engine worker, as a session drives its slot (``inference.slots.worker.EngineWorker``)."""

    def open(
        self,
        slot: int,
        config: SlotConfig,
        listener: SlotListener,
        loop: asyncio.AbstractEventLoop,
        recording: SessionRecording | None = None,
    ) -> None: ...
    def freeze(self, slot: int, frozen: bool) -> None: ...
    def cancel(self, slot: int) -> None: ...
    def force_listen(self, slot: int) -> None: ...
    def set_image(self, slot: int, image: bytes) -> None: ...
    def set_turn(self, slot: int, turn: SlotTurn) -> None: ...
    def chat(
        self, slot: int, request: ChatRequest, listener: ChatListener, loop: asyncio.AbstractEventLoop
    ) -> None: ...
    def push(self, slot: int, samples: np.ndarray) -> bool: ...
    def stats(self) -> WorkerStats: ...
    def take_slot_counters(self, slot: int) -> SlotCounters: ...


class Admission(Protocol):
    """The slot pool, as a session asks it for its queue position and gives its slot back (``SlotPool``)."""

    def request(self, session) -> None: ...  # a session, or a chat response (inference.turns.chat)
    def tell_position(self, session: Applicant) -> None: ...
    def release(self, session: Applicant, slot: int | None, held_s: float = 0.0) -> None: ...


class Attachment(Protocol):
    """A connection attached to the session: the session only ever writes to its outbox."""

    outbox: Outbox


@dataclass(frozen=True)
class SessionTimeouts:
    """The timers every session runs (seconds), from the service configuration."""

    disconnect_grace_s: float
    max_session_s: float
    pause_timeout_s: float
    idle_timeout_s: float

    @classmethod
    def from_config(cls, config: InferenceConfig) -> SessionTimeouts:
        return cls(config.disconnect_grace_s, config.max_session_s, config.pause_timeout_s, config.idle_timeout_s)


@dataclass(frozen=True)
class SessionContext:
    """What the sessions of one service share: capabilities, event loop, collaborators, timeouts."""

    capabilities: EngineCapabilities
    loop: asyncio.AbstractEventLoop
    worker: SlotDriver
    admission: Admission
    timeouts: SessionTimeouts
    forget: Callable[[Any], None]  # the service drops a closed session (a DialogueSession) from its registry
    recording: RecordingPolicy = RecordingPolicy()  # whether sessions are recorded, and the recorder
    test_output_jitter_ms: float = 0.0  # test-only: random 0..N ms delays on outgoing audio (output_jitter.py)
    test_output_jitter_s: float = 0.0  # ... during a session's first N seconds of output (0 = always)
