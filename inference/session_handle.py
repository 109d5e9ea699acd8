"""``SessionHandle``: the contract of one connection to a user's persistent session, in-process or over the link.

``inference.api`` hands it to the web tier (``api.SessionHandle``); ``inference.session.local_handle`` and
``inference.transport.client`` implement it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Literal, Protocol

from inference.contracts import ChatMessage, Mode, SessionEvent, TurnDetection, VoiceRef


class SessionHandle(Protocol):
    """One attachment (one WebSocket) to a user's persistent session.

    Methods raise ``ParleyError`` with the protocol code on bad input; the session goes on.
    """

    @property
    def session_id(self) -> str | None: ...  # None while queued

    def events(self) -> AsyncIterator[SessionEvent]:
        """Queued* -> Ready -> (Prefill | AudioOut | TextOut | Decision | Metrics | ...)* -> Closed | Replaced."""
        ...

    def send_events_directly(self, take: Callable[[SessionEvent], bool] | None) -> None:
        """Offer events to ``take`` before queueing them for ``events()`` (the web tier's outbound lane).

        While the handle's own queue of events is empty, an event that would be queued is first offered to
        ``take``, on the event loop, at the moment it arrives: True means ``take`` consumed it (sent it) and it is
        not queued; False queues it as before. An event is never offered while an earlier one waits in the queue,
        so what ``take`` consumes and what ``events()`` yields keep the session's order. ``take`` must not raise.
        None removes the hook (the handle then keeps no reference to it)."""

    async def update(
        self,
        *,
        persona: str | None = None,
        voice: VoiceRef | None = None,
        record: bool | None = None,
        record_video: bool | None = None,
    ) -> None:
        """Set persona / voice / the wish to be recorded; raises persona_update_unsupported /
        voice_update_unsupported / record_update_unsupported on a change after audio began.
        ``record_video``: keep the camera frames the engine sees (any time; audio recording is unchanged)."""

    async def append_audio(
        self, data: bytes, *, encoding: Literal["pcm16", "f32"], rate: int, answered: bool = True
    ) -> None:
        """Raw little-endian samples of any length; reframed and resampled to the engine's chunk.

        Raises invalid_audio (odd byte count, NaN/Inf), unsupported_audio_format, session_not_ready,
        input_backpressure. ``answered=False`` (an append with no event id to answer) lets a handle on a
        separate service send without waiting for the reply: what the session refuses later than the bytes
        themselves (input_backpressure, session_not_ready) then arrives as an ``ErrorEvent``.
        """

    def append_audio_now(self, data: bytes, *, encoding: Literal["pcm16", "f32"], rate: int) -> bool:
        """``append_audio(answered=False)`` for a caller that cannot wait (the web tier's inbound lane): True once
        appended, False when it would have to wait (the link to a separate service is behind or lost), and the
        caller then takes ``append_audio``. Raises what ``append_audio`` raises, before appending anything."""

    async def append_image(self, data: bytes) -> None:
        """One JPEG/PNG camera frame; unsupported_input on engines without video."""

    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def cancel(self) -> None:
        """Barge-in: advance the epoch; queued audio of the old epoch is dropped."""

    async def force_listen(self) -> None: ...
    async def playback_ack(self, played_ms: float, heard: Sequence[tuple[int, int]] = ()) -> None:
        """``heard``: instants since the previous ack, each (input_samples, output_samples) (docs/protocol.md)."""

    async def set_mode(
        self, *, mode: Mode | None, turn_detection: TurnDetection | None, max_response_s: int | None = None
    ) -> None:
        """Duplex, half-duplex or chat, and half-duplex's turn detection (None: the client commits turns).

        Raises unsupported_mode (the engine does not serve it), mode_update_unsupported (after audio
        began), invalid_value (settings out of range)."""

    async def commit_input(self) -> None:
        """Half-duplex: the caller's turn ends here (input_audio_buffer_commit_empty under 100 ms)."""

    async def clear_input(self) -> None: ...
    async def create_response(self) -> None:
        """Half-duplex: answer now; chat: answer the conversation, taking a slot (or queueing) until the reply
        ends. conversation_already_has_active_response while one runs."""

    async def add_chat_item(self, message: ChatMessage) -> None:
        """Chat: add a message to the conversation. unsupported_mode outside chat, message_too_large,
        invalid_image, invalid_audio, invalid_value (an empty message)."""

    async def close(self, reason: str = "client_close") -> None:
        """End the session now; the slot is freed once the engine confirms cleanup."""

    async def detach(self) -> None:
        """The socket dropped: keep the session paused for disconnect_grace_s, then close it."""
