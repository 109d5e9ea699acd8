"""Frozen dataclasses and typed errors that cross the seam between ``webapp`` and ``inference``.

``webapp`` imports only this module and ``inference.api``. This is the leaf of the package: the
engines, the service and the web tier all import it, and it imports nothing of theirs (nor torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "AudioOut",
    "ChatMessage",
    "Closed",
    "CloseReason",
    "Decision",
    "EngineCapabilities",
    "ErrorEvent",
    "Family",
    "Metrics",
    "Mode",
    "ParleyError",
    "Paused",
    "Prefill",
    "Queued",
    "Ready",
    "Replaced",
    "ResponseEnded",
    "ResponseStarted",
    "Resumed",
    "SessionEvent",
    "SessionRequest",
    "SpeechStarted",
    "SpeechStopped",
    "TextOut",
    "TurnCommitted",
    "TurnDetection",
    "VoiceRef",
    "WorkerSnapshot",
]

Family = Literal["echo", "lockstep", "unit"]
# How a session takes turns: the engine decides (duplex), server VAD or client commits cut the caller's
# speech into turns that each get a response (half_duplex), or typed messages, each answered (chat).
Mode = Literal["duplex", "half_duplex", "chat"]
MODES: tuple[Mode, ...] = ("duplex", "half_duplex", "chat")


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do; sent to clients inside ``session.created.session.duplex``."""

    engine: str  # e.g. "echo", "moshi", "personaplex", "minicpmo"
    family: Family
    chunk_period_ms: int  # the engine clock: 80 for lockstep, 1000 for unit engines
    input_rate: int  # the engine's native input sample rate (Hz)
    input_chunk_samples: int  # samples per tick per slot at input_rate
    output_rate: int  # sample rate of SlotOutput.audio (Hz)
    video: bool = False
    barge_in: bool = True
    pause: bool = True
    resume: bool = True
    demo_weights: bool = False  # random weights: the UI shows a banner
    modes: tuple[Mode, ...] = ("duplex",)  # the session modes this engine serves
    extra: Mapping[str, Any] = field(default_factory=dict)  # engine-specific facts, e.g. vocoder, memory_s


@dataclass(frozen=True)
class VoiceRef:
    """A voice the webapp resolved for a session: a file the engine knows how to read."""

    voice_id: str
    path: Path | None = None  # .pt / .safetensors (PersonaPlex prompt) or .wav / .npy reference audio


CloseReason = Literal[
    "client_close",
    "pause_timeout",
    "grace_expired",
    "max_duration",
    "idle_timeout",
    "admin_ended",
    "engine_failed",
    "replaced",
    "shutdown",
    "credentials_revoked",  # the web tier: the socket's API key was revoked or its user deactivated
]


@dataclass(frozen=True)
class SessionRequest:
    """A user's request for their one persistent session."""

    user_key: str  # stable per user: a second request with the same key takes the session over
    model: str | None = None  # engine name; None = the service's default
    persona: str | None = None
    voice: VoiceRef | None = None
    record: bool = True  # the caller's wish; the deployment's PARLEY_RECORD=on|off overrides it
    # "chat" on an engine that serves it: a new session opens at once in chat mode, taking no slot (each of
    # its responses takes one); any other value, or an engine without chat, opens as usual.
    mode: Mode | None = None


@dataclass(frozen=True)
class TurnDetection:
    """OpenAI Realtime ``server_vad`` settings, with OpenAI's field names and defaults."""

    threshold: float = 0.5  # speech probability in [0, 1] that starts speech
    prefix_padding_ms: int = 300  # audio before the detected start that belongs to the turn
    silence_duration_ms: int = 500  # silence that ends the turn
    create_response: bool = True  # answer each committed turn
    interrupt_response: bool = True  # speech during a response cancels it (barge-in)


# Accepted ranges of the numeric server_vad fields (the web tier's parser and the session both check them).
TURN_DETECTION_LIMITS: dict[str, tuple[float, float]] = {
    "threshold": (0.0, 1.0),
    "prefix_padding_ms": (0, 10_000),
    "silence_duration_ms": (0, 10_000),
}


# Chat messages (conversation.item.create): the size limit of one message, checked by the session.
MAX_CHAT_TEXT_CHARS = 8_000
MAX_CHAT_ITEM_BYTES = 512 * 1024  # text (UTF-8), image and audio of one message together
MAX_CHAT_AUDIO_S = 30.0


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat conversation: text and, for the user, optionally one image and one audio clip."""

    role: Literal["user", "assistant"]
    text: str = ""
    image: bytes | None = None  # JPEG or PNG
    audio: bytes | None = None  # pcm16 little-endian mono at ``audio_rate``
    audio_rate: int = 16_000

    @property
    def nbytes(self) -> int:
        return len(self.text.encode("utf-8", "surrogatepass")) + len(self.image or b"") + len(self.audio or b"")


# ---- events the web tier receives from a session handle ------------------------------------


@dataclass(frozen=True)
class Queued:
    position: int  # 1-based
    queue_length: int
    estimated_wait_s: float


@dataclass(frozen=True)
class Ready:
    """Admitted (or resumed / taken over): the session is live on this handle."""

    session_id: str
    resumed: bool
    capabilities: EngineCapabilities
    persona: str | None
    voice: str | None
    recorded: bool = False  # whether this session is being recorded (policy and the caller's wish)
    mode: Mode = "duplex"  # how the session takes turns (a resumed session keeps its mode)
    turn_detection: dict[str, Any] | None = None  # half-duplex server_vad fields (None: client commits)


@dataclass(frozen=True)
class Prefill:
    """The slot is being prepared (voice and persona prefill); progress in [0, 1]."""

    progress: float
    done: bool


@dataclass(frozen=True)
class AudioOut:
    pcm16: bytes  # little-endian int16 mono at capabilities.output_rate
    epoch: int


@dataclass(frozen=True)
class TextOut:
    text: str
    epoch: int


@dataclass(frozen=True)
class Decision:
    """Unit engines: the model's choice for one unit."""

    kind: Literal["listen", "speak"]
    unit: int
    end_of_turn: bool


@dataclass(frozen=True)
class SpeechStarted:
    """Half-duplex: the caller started speaking at ``audio_start_ms`` of the session's input stream."""

    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    audio_end_ms: int


@dataclass(frozen=True)
class TurnCommitted:
    """The caller's turn is committed (by server VAD or ``input_audio_buffer.commit``)."""


@dataclass(frozen=True)
class ResponseStarted:
    """A turn-based response begins; its output carries ``epoch``."""

    epoch: int


@dataclass(frozen=True)
class ResponseEnded:
    epoch: int
    status: Literal["completed", "cancelled", "incomplete", "failed"]


@dataclass(frozen=True)
class Metrics:
    values: dict[str, Any]  # tick_ms_p50, tick_ms_p99, frames_in, frames_out, dropped_frames, lag_ms, ...


@dataclass(frozen=True)
class Paused:
    pass


@dataclass(frozen=True)
class Resumed:
    pass


@dataclass(frozen=True)
class Replaced:
    """Another connection of the same user took this session over; this handle is finished."""


@dataclass(frozen=True)
class Closed:
    reason: CloseReason
    # It ended before its recording began (no audio, no chat message): the web tier drops the catalogue row.
    # Advice for that cleanup, not part of what the close is: left out of equality.
    nothing_recorded: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class ErrorEvent:
    """An error the session reports on its own, outside any call (e.g. engine_failed before it closes)."""

    code: str
    message: str
    error_type: str = "invalid_request_error"


SessionEvent = (
    Queued
    | Ready
    | Prefill
    | AudioOut
    | TextOut
    | Decision
    | Metrics
    | Paused
    | Resumed
    | Replaced
    | Closed
    | ErrorEvent
    | SpeechStarted
    | SpeechStopped
    | TurnCommitted
    | ResponseStarted
    | ResponseEnded
)


# ---- errors -----------------------------------------------------------------------------------


class ParleyError(Exception):
    """An error with a protocol code (see the spec's Errors section). Raised by the facade."""

    code: str = "internal_error"
    error_type: str = "invalid_request_error"

    def __init__(
        self, message: str, *, code: str | None = None, error_type: str | None = None, param: str | None = None
    ):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if error_type is not None:
            self.error_type = error_type
        self.param = param


# ---- operations view ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotSnapshot:
    slot: int
    state: Literal["free", "prefilling", "live", "paused", "detached", "closing"]
    session_id: str | None = None
    user_key: str | None = None
    age_s: float = 0.0


@dataclass(frozen=True)
class WorkerSnapshot:
    engine: str
    device: str
    num_slots: int
    slots: tuple[SlotSnapshot, ...]
    queue_length: int
    tick_ms_p50: float
    tick_ms_p99: float
    recent_tick_ms: tuple[float, ...] = field(default_factory=tuple)  # for the occupancy chart
    memory: dict[str, float] = field(default_factory=dict)
