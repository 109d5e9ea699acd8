"""``LocalHandle``: the in-process ``SessionHandle``, one connection's view of a ``DialogueSession``.

The embedded default hands it to the web tier directly, and the socket server serves each of its
connections with one. Calls go straight to the session, or to its turn-based modes (``session.modes``) for a
mode's requests; events come from the handle's own bounded ``Outbox``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, get_args

from inference.contracts import ChatMessage, CloseReason, Mode, ParleyError, SessionEvent, TurnDetection, VoiceRef
from inference.session.handle_calls import NoArgumentCalls
from inference.session.outbox import Outbox

if TYPE_CHECKING:
    from inference.session.dialogue import DialogueSession

CLOSE_REASONS: frozenset[str] = frozenset(get_args(CloseReason))
# The calls the session's turn-based modes answer (``inference.turns.session_modes.TurnModes``), not the session.
TURN_CALLS = frozenset({"commit_input", "clear_input", "create_response"})


class LocalHandle(NoArgumentCalls):
    """The in-process ``SessionHandle``: one connection's view of a ``DialogueSession``."""

    def __init__(self, session: DialogueSession, max_audio: int):
        self._session = session
        self.outbox = Outbox(max_audio)

    @property
    def session_id(self) -> str | None:
        return None if self._session.state == "queued" else self._session.session_id

    def events(self) -> AsyncIterator[SessionEvent]:
        return self.outbox.stream()

    def send_events_directly(self, take: Callable[[SessionEvent], bool] | None) -> None:
        self.outbox.direct = take

    async def _forward(self, name: str) -> None:
        session = self._current()
        getattr(session.modes if name in TURN_CALLS else session, name)()

    def _current(self) -> DialogueSession:
        if self._session.attachment is not self:
            if self._session.state == "closed":  # a closed session lets go of its handle
                raise ParleyError("the session is closed", code="session_not_ready")
            raise ParleyError("this connection no longer owns the session", code="session_not_ready")
        return self._session

    async def update(
        self,
        *,
        persona: str | None = None,
        voice: VoiceRef | None = None,
        record: bool | None = None,
        record_video: bool | None = None,
    ) -> None:
        self._current().update(persona=persona, voice=voice, record=record, record_video=record_video)

    async def append_audio(self, data: bytes, *, encoding: str, rate: int, answered: bool = True) -> None:
        self._current().append_audio(data, encoding, rate)  # in-process every refusal answers the append

    def append_audio_now(self, data: bytes, *, encoding: str, rate: int) -> bool:
        self._current().append_audio(data, encoding, rate)  # in-process nothing waits
        return True

    async def append_image(self, data: bytes) -> None:
        self._current().append_image(data)

    async def playback_ack(self, played_ms: float, heard: Sequence[tuple[int, int]] = ()) -> None:
        self._current().playback_ack(played_ms, heard)

    async def set_mode(
        self, *, mode: Mode | None, turn_detection: TurnDetection | None, max_response_s: int | None = None
    ) -> None:
        self._current().modes.set_mode(mode, turn_detection, max_response_s)

    async def add_chat_item(self, message: ChatMessage) -> None:
        self._current().modes.add_chat_item(message)

    async def close(self, reason: str = "client_close") -> None:
        """End the session; a handle that was replaced or already closed does nothing."""
        if reason not in CLOSE_REASONS:
            raise ParleyError(f"unknown close reason {reason!r}", code="invalid_value", param="reason")
        if self._session.attachment is self:
            self._session.close(reason)  # type: ignore[arg-type]

    async def detach(self) -> None:
        self._session.detach(self)
