"""FACADE: the only module (with ``inference.contracts``) that ``webapp`` imports.

It talks to an in-process inference service in the embedded default, and to the co-located
service process (``python -m inference serve``) over a local socket when ``PARLEY_INFERENCE_URL``
is set. Either way the web tier never imports torch.

The signatures below are the contract between the web tier and the inference service.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol

from inference.contracts import SessionEvent, SessionRequest, VoiceRef, WorkerSnapshot


class SessionHandle(Protocol):
    """One attachment (one WebSocket) to a user's persistent session.

    Methods raise ``ParleyError`` with the protocol code on bad input; the session goes on.
    """

    @property
    def session_id(self) -> str | None: ...  # None while queued

    def events(self) -> AsyncIterator[SessionEvent]:
        """Queued* -> Ready -> (Prefill | AudioOut | TextOut | Decision | Metrics | ...)* -> Closed | Replaced."""
        ...

    async def update(self, *, persona: str | None = None, voice: VoiceRef | None = None) -> None:
        """Set persona / voice; raises persona_update_unsupported / voice_update_unsupported after audio began."""

    async def append_audio(self, data: bytes, *, encoding: Literal["pcm16", "f32"], rate: int) -> None:
        """Raw little-endian samples of any length; reframed and resampled to the engine's chunk.

        Raises invalid_audio (odd byte count, NaN/Inf), unsupported_audio_format, session_not_ready,
        input_backpressure.
        """

    async def append_image(self, data: bytes) -> None:
        """One JPEG/PNG camera frame; unsupported_input on engines without video."""

    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def cancel(self) -> None:
        """Barge-in: advance the epoch; queued audio of the old epoch is dropped."""

    async def force_listen(self) -> None: ...
    async def playback_ack(self, played_ms: float) -> None: ...

    async def close(self, reason: str = "client_close") -> None:
        """End the session now; the slot is freed once the engine confirms cleanup."""

    async def detach(self) -> None:
        """The socket dropped: keep the session paused for disconnect_grace_s, then close it."""


async def open_session(request: SessionRequest) -> SessionHandle:
    """Attach to the user's session: takes over a live one, resumes a detached one, or queues for a slot.

    Raises ``ParleyError(code="resource_exhausted", error_type="rate_limit_error")`` when the queue is full.
    """
    raise NotImplementedError


async def occupancy() -> list[WorkerSnapshot]:
    """Per-worker slot states and tick timings for the operations view."""
    raise NotImplementedError


async def end_session(session_id: str, reason: str = "admin_ended") -> bool:
    """Admin: end a session by id. Returns False if it does not exist."""
    raise NotImplementedError


def capabilities_preview() -> dict:
    """The default engine's capabilities as a plain dict (for pages rendered before a call)."""
    raise NotImplementedError


async def shutdown() -> None:
    """Stop the in-process service, if one runs (tests, process exit)."""
    raise NotImplementedError
