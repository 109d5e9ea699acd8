"""The session's side of turn-based modes: ``DialogueSession`` mixes this in (kept out of dialogue.py).

It owns the mode choice and hands half-duplex work to ``HalfDuplex`` (acting as its ``TurnHost``) and chat
to ``Chat`` (its ``ChatHost``). A chat session gives its slot back when it enters chat mode: each response
takes one from the pool only while it runs.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from inference.contracts import AudioOut, ChatMessage, Mode, ParleyError, SessionEvent, TextOut, TurnDetection
from inference.engines.base import SlotTurn
from inference.recording.chat_steps import ChatRecording
from inference.turns.chat import MAX_RESPONSE_S_LIMIT, Chat
from inference.turns.half_duplex import HalfDuplex

if TYPE_CHECKING:
    from inference.session.dialogue import DialogueSession


class TurnModes:
    """Mode handling for ``DialogueSession`` (duplex by default; half-duplex on engines that list it)."""

    mode: Mode = "duplex"
    turns: HalfDuplex | None = None
    chat: Chat | None = None
    chat_started = False  # a chat message was added: whether the session is recorded is fixed from then on
    chat_recording: ChatRecording | None = None

    def set_mode(
        self: DialogueSession,
        mode: Mode | None,
        detection: TurnDetection | None,
        max_response_s: int | None = None,
    ) -> None:
        """Choose the mode (``None``: keep it) and, for half-duplex, its turn detection."""
        mode = mode or self.mode
        if mode not in self.caps.modes:
            raise ParleyError(
                f"engine {self.caps.engine!r} serves the modes {list(self.caps.modes)}, not {mode!r}",
                code="unsupported_mode",
                param="mode",
            )
        if mode != self.mode and self.audio_started:
            raise ParleyError("the mode is fixed once audio has started", code="mode_update_unsupported", param="mode")
        if self.mode == "chat" and mode != "chat":
            raise ParleyError("a chat session stays in chat mode", code="mode_update_unsupported", param="mode")
        if mode == "chat":
            self._enter_chat(max_response_s)
        if mode == "half_duplex":
            turns = self.turns or HalfDuplex(self, self.loop, self.caps.input_rate)
            turns.configure(detection, max_response_s)  # raises before anything changed
            self.turns = turns
        self.mode = mode

    def _enter_chat(self: DialogueSession, max_response_s: int | None) -> None:
        if max_response_s is not None and not 1 <= max_response_s <= MAX_RESPONSE_S_LIMIT:
            raise ParleyError(
                f"max_response_s must lie in [1, {MAX_RESPONSE_S_LIMIT}]", code="invalid_value", param="max_response_s"
            )
        self._require_admitted()
        if self.chat is None:
            self.chat = Chat(self, self._admission, self._worker, self.loop)
            if self.slot is not None:  # the slot goes back to the pool until a response needs one
                self._admission.release(self, self.slot)
                self.slot = None
        if max_response_s is not None:
            self.chat.max_response_s = max_response_s

    def admit_for_chat(self: DialogueSession) -> None:
        """Open a new session in chat mode (``SessionRequest.mode``): admitted at once, holding no slot."""
        self.state = "admitted"
        self._enter_chat(None)
        self.mode = "chat"
        self.admitted(None)  # timers and Ready (mode chat), as an admission from the pool

    def _chat(self: DialogueSession) -> Chat:
        self._require_admitted()
        if self.chat is None or self.mode != "chat":
            raise ParleyError(
                "conversation items are taken in chat mode only; set session.duplex.mode to chat",
                code="unsupported_mode",
                param="mode",
            )
        self.last_activity = time.monotonic()
        return self.chat

    def add_chat_item(self: DialogueSession, message: ChatMessage) -> None:
        self._chat().add(message)
        if not self.chat_started:  # the chat's recording starts with its first message, as a call's with audio
            self.chat_started = True
            self._begin_recording()
            if self.recording is not None:
                self.chat_recording = ChatRecording(self.recording, self._recording_policy.meta)
                self._record("mode", mode=self.mode, turn_detection=None)  # the review names it
        if self.chat_recording is not None:
            self.chat_recording.message(message)

    def _check_chat_record(self: DialogueSession, record: bool | None) -> None:
        if self.chat_started and record is not None and self._recording_policy.records(record) != self.recorded:
            raise ParleyError(
                "recording is fixed once the chat's first message was added",
                code="record_update_unsupported",
                param="record",
            )

    def _half_duplex(self: DialogueSession) -> HalfDuplex:
        self._require_admitted()
        if self.turns is None or self.mode != "half_duplex":
            raise ParleyError("only half-duplex sessions take turns", code="unsupported_mode", param="mode")
        return self.turns

    def commit_input(self: DialogueSession) -> None:
        self._half_duplex().commit()

    def clear_input(self: DialogueSession) -> None:
        self._half_duplex().clear()

    def create_response(self: DialogueSession) -> None:
        if self.mode == "chat":
            self._chat().create_response()
            return
        turns = self._half_duplex()
        if not self.audio_started:
            raise ParleyError("nothing to answer: no audio has been sent yet", code="input_audio_buffer_commit_empty")
        turns.create_response()

    def turn_detection_fields(self: DialogueSession) -> dict | None:
        """The half-duplex server_vad settings for a (re)attached connection's session object."""
        if self.mode != "half_duplex" or self.turns is None or self.turns.detection is None:
            return None
        return dataclasses.asdict(self.turns.detection)

    def _check_streaming_mode(self: DialogueSession) -> None:
        if self.mode == "chat":
            raise ParleyError(
                "a chat session takes audio inside conversation items, not as a stream",
                code="unsupported_mode",
                param="mode",
            )

    def _modes_cancelled(self: DialogueSession) -> None:
        """``response.cancel`` (or barge-in), after the session moved to a new epoch."""
        if self.turns is not None:
            self.turns.response_cancelled()
        if self.chat is not None:
            self.chat.cancelled()

    def _modes_closed(self: DialogueSession) -> None:
        if self.turns is not None:
            self.turns.close()
        if self.chat is not None:
            self.chat.close()

    # ---- TurnHost ---------------------------------------------------------------------------------

    def emit(self: DialogueSession, event: SessionEvent) -> None:
        # Turn events go into the recording too (speech_started at ..., response ended cancelled ...); a chat
        # reply's text and audio go in as its steps.
        if isinstance(event, TextOut | AudioOut):
            if self.chat_recording is not None:
                if isinstance(event, TextOut):
                    self.chat_recording.reply_text(event.text)
                else:
                    self.chat_recording.reply_audio(event.pcm16)
        else:
            self._record("turn", event=type(event).__name__, **dataclasses.asdict(event))
        self._emit(event)

    def set_turn(self: DialogueSession, turn: SlotTurn) -> None:
        if self.audio_started and self.slot is not None and self.state != "closed":
            self._worker.set_turn(self.slot, turn)

    def next_epoch(self: DialogueSession) -> int:
        self.epoch += 1
        self._record("epoch", epoch=self.epoch, response=True)
        if self.attachment is not None:
            self.attachment.outbox.drop_epoch_before(self.epoch)
        return self.epoch
