"""A session's turn-based modes: ``TurnModes``, the collaborator of ``DialogueSession`` that owns the mode.

It owns the mode choice and hands half-duplex work to ``HalfDuplex`` (acting as its ``TurnHost``) and chat
to ``Chat`` (its ``ChatHost``). A chat session gives its slot back when it enters chat mode: each response
takes one from the pool only while it runs. It sees its session only as a ``ModesHost``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from typing import Protocol

from inference.contracts import (
    AudioOut,
    ChatMessage,
    EngineCapabilities,
    Mode,
    ParleyError,
    SessionEvent,
    TextOut,
    TurnDetection,
    VoiceRef,
)
from inference.engines.base import SlotTurn
from inference.recording.chat_steps import ChatRecording
from inference.turns.chat import MAX_RESPONSE_S_LIMIT, Chat, ChatWorker, SlotRequests
from inference.turns.half_duplex import HalfDuplex


class TurnRecording(Protocol):
    """The session's recording, as its modes write to it (``inference.session.recording.SessionRecorder``)."""

    def event(self, kind: str, **fields) -> None: ...
    def chat_steps(self) -> ChatRecording | None: ...  # a chat's steps, None when the session is not recorded


class ModesHost(Protocol):
    """The session, as its modes see it (``inference.session.dialogue.DialogueSession``)."""

    session_id: str
    user_key: str
    persona: str | None
    voice: VoiceRef | None
    audio_started: bool

    def require_admitted(self) -> None: ...
    def touch(self) -> None: ...  # a request: activity for the idle watchdog
    def give_back_slot(self) -> None: ...  # chat: the slot goes back to the pool until a response needs one
    def begin_recording(self) -> None: ...
    def emit(self, event: SessionEvent) -> None: ...  # to the connection
    def set_turn(self, turn: SlotTurn) -> None: ...  # to the slot, once it is open
    def next_epoch(self) -> int: ...
    def cancel(self) -> None: ...


class TurnModes:
    """Mode handling for one session (duplex by default; half-duplex and chat on engines that list them).

    Args:
        host: the session.
        caps: the engine's capabilities (its modes and input rate).
        loop: the service's event loop.
        pool: where a chat response asks for a slot.
        worker: what runs a chat response.
        recorder: the session's recording, where turn events and chat steps go.
    """

    def __init__(
        self,
        host: ModesHost,
        caps: EngineCapabilities,
        loop: asyncio.AbstractEventLoop,
        pool: SlotRequests,
        worker: ChatWorker,
        recorder: TurnRecording,
    ):
        self._host, self._caps, self._loop = host, caps, loop
        self._pool, self._worker, self._recorder = pool, worker, recorder
        self.mode: Mode = "duplex"
        self.turns: HalfDuplex | None = None
        self.chat: Chat | None = None
        self.chat_started = False  # a chat message was added: whether the session is recorded is fixed from then on
        self.chat_recording: ChatRecording | None = None

    # ---- ChatHost: the session's identity, persona and voice ------------------------------------

    @property
    def session_id(self) -> str:
        return self._host.session_id

    @property
    def user_key(self) -> str:
        return self._host.user_key

    @property
    def persona(self) -> str | None:
        return self._host.persona

    @property
    def voice(self) -> VoiceRef | None:
        return self._host.voice

    # ---- requests -------------------------------------------------------------------------------

    def set_mode(self, mode: Mode | None, detection: TurnDetection | None, max_response_s: int | None = None) -> None:
        """Choose the mode (``None``: keep it) and, for half-duplex, its turn detection."""
        mode = mode or self.mode
        if mode not in self._caps.modes:
            raise ParleyError(
                f"engine {self._caps.engine!r} serves the modes {list(self._caps.modes)}, not {mode!r}",
                code="unsupported_mode",
                param="mode",
            )
        if mode != self.mode and self._host.audio_started:
            raise ParleyError("the mode is fixed once audio has started", code="mode_update_unsupported", param="mode")
        if self.mode == "chat" and mode != "chat":
            raise ParleyError("a chat session stays in chat mode", code="mode_update_unsupported", param="mode")
        if mode == "chat":
            self._enter_chat(max_response_s)
        if mode == "half_duplex":
            # Weakly, as the session's own collaborators see it: no reference cycle outlives the call.
            turns = self.turns or HalfDuplex(weakref.proxy(self), self._loop, self._caps.input_rate)
            turns.configure(detection, max_response_s)  # raises before anything changed
            self.turns = turns
        self.mode = mode

    def start_in_chat(self) -> None:
        """A session opened in chat mode (``SessionRequest.mode``), just admitted holding no slot."""
        self._enter_chat(None)
        self.mode = "chat"

    def _enter_chat(self, max_response_s: int | None) -> None:
        if max_response_s is not None and not 1 <= max_response_s <= MAX_RESPONSE_S_LIMIT:
            raise ParleyError(
                f"max_response_s must lie in [1, {MAX_RESPONSE_S_LIMIT}]", code="invalid_value", param="max_response_s"
            )
        self._host.require_admitted()
        if self.chat is None:
            self.chat = Chat(weakref.proxy(self), self._pool, self._worker, self._loop)
            self._host.give_back_slot()
        if max_response_s is not None:
            self.chat.max_response_s = max_response_s

    def _chat(self) -> Chat:
        self._host.require_admitted()
        if self.chat is None or self.mode != "chat":
            raise ParleyError(
                "conversation items are taken in chat mode only; set session.duplex.mode to chat",
                code="unsupported_mode",
                param="mode",
            )
        self._host.touch()
        return self.chat

    def add_chat_item(self, message: ChatMessage) -> None:
        self._chat().add(message)
        if not self.chat_started:  # the chat's recording starts with its first message, as a call's with audio
            self.chat_started = True
            self._host.begin_recording()
            self.chat_recording = self._recorder.chat_steps()
            if self.chat_recording is not None:
                self._recorder.event("mode", mode=self.mode, turn_detection=None)  # the review names it
        if self.chat_recording is not None:
            self.chat_recording.message(message)

    def _half_duplex(self) -> HalfDuplex:
        self._host.require_admitted()
        if self.turns is None or self.mode != "half_duplex":
            raise ParleyError("only half-duplex sessions take turns", code="unsupported_mode", param="mode")
        return self.turns

    def commit_input(self) -> None:
        self._half_duplex().commit()

    def clear_input(self) -> None:
        self._half_duplex().clear()

    def create_response(self) -> None:
        if self.mode == "chat":
            self._chat().create_response()
            return
        turns = self._half_duplex()
        if not self._host.audio_started:
            raise ParleyError("nothing to answer: no audio has been sent yet", code="input_audio_buffer_commit_empty")
        turns.create_response()

    # ---- what the session asks of its modes ------------------------------------------------------

    def turn_detection_fields(self) -> dict | None:
        """The half-duplex server_vad settings for a (re)attached connection's session object."""
        if self.mode != "half_duplex" or self.turns is None or self.turns.detection is None:
            return None
        return dataclasses.asdict(self.turns.detection)

    def check_streaming(self) -> None:
        """Before the first streamed audio: a chat session takes audio inside its items only."""
        if self.mode == "chat":
            raise ParleyError(
                "a chat session takes audio inside conversation items, not as a stream",
                code="unsupported_mode",
                param="mode",
            )

    def cancelled(self) -> None:
        """``response.cancel`` (or barge-in), after the session moved to a new epoch."""
        if self.turns is not None:
            self.turns.response_cancelled()
        if self.chat is not None:
            self.chat.cancelled()

    def closed(self) -> None:
        if self.turns is not None:
            self.turns.close()
        if self.chat is not None:
            self.chat.close()

    # ---- TurnHost and ChatHost ------------------------------------------------------------------

    def emit(self, event: SessionEvent) -> None:
        # Turn events go into the recording too (speech_started at ..., response ended cancelled ...); a chat
        # reply's text and audio go in as its steps.
        if isinstance(event, TextOut | AudioOut):
            if self.chat_recording is not None:
                if isinstance(event, TextOut):
                    self.chat_recording.reply_text(event.text)
                else:
                    self.chat_recording.reply_audio(event.pcm16)
        else:
            self._recorder.event("turn", event=type(event).__name__, **dataclasses.asdict(event))
        self._host.emit(event)

    def set_turn(self, turn: SlotTurn) -> None:
        self._host.set_turn(turn)

    def next_epoch(self) -> int:
        return self._host.next_epoch()

    def cancel(self) -> None:
        self._host.cancel()
