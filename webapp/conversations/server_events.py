"""Server events of ``/v1/realtime``: ids, sequence numbers, the session object and responses.

Pure bookkeeping, no I/O: the consumer hands facade events in and sends what comes out.
A lockstep engine speaks continuously, so one long-lived response carries its audio; a barge-in
(``response.cancel``) or a new epoch ends it and the next output opens a new one.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass, field
from typing import Any

from inference.contracts import AudioOut, EngineCapabilities, TextOut
from webapp.conversations.protocol import OUTPUT_FORMAT, audio_frame

Outgoing = dict[str, Any] | bytes  # a JSON event, or a binary audio frame
TRANSCRIPT_KEEP_CHARS = 65_536  # the .done event repeats the transcript; keep memory bounded


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


@dataclass
class SessionView:
    """What the client configured plus what the engine offers: rendered as the session object."""

    model: str | None
    input_rates: tuple[int, ...]
    session_id: str | None = None
    capabilities: EngineCapabilities | None = None
    instructions: str | None = None
    persona_id: int | None = None
    persona_version: int | None = None
    persona_name: str | None = None  # the saved persona's name, for a page to show (None for free text)
    voice: str | None = None
    voice_id: int | None = None
    input_type: str = "audio/pcm"
    input_rate: int = 24_000
    binary_audio: bool = False
    record: bool = False
    resumed: bool = False
    mode: str = "duplex"  # duplex | half_duplex | chat
    turn_detection: dict[str, Any] | None = None  # half-duplex server_vad settings (None: client commits)
    max_response_s: int | None = None

    @property
    def output_rate(self) -> int:
        return self.capabilities.output_rate if self.capabilities else 24_000


@dataclass
class _Response:
    id: str
    item_id: str
    epoch: int
    transcript: list[str] = field(default_factory=list)
    transcript_chars: int = 0


class RealtimeEvents:
    """Builds every server event of one socket, stamping ``event_id`` and ``server_event_seq``."""

    def __init__(self, view: SessionView):
        self.view = view
        self._seq = 0
        self._response: _Response | None = None
        self._previous_item_id: str | None = None
        self._drop_through_epoch = -1  # outputs of epochs <= this were cancelled
        self._last_epoch = -1

    def event(self, event_type: str, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        return {"type": event_type, "event_id": new_id("event"), "server_event_seq": self._seq, **fields}

    def error(
        self,
        code: str,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        client_event_id: str | None = None,
    ) -> dict[str, Any]:
        body = {"type": error_type, "code": code, "message": message, "param": param, "event_id": client_event_id}
        return self.event("error", error=body)

    # ---- the session object (OpenAI GA shape + duplex) ----------------------------------------

    def capabilities(self) -> dict[str, Any]:
        caps = self.view.capabilities
        if caps is None:
            return {}
        extra = dict(caps.extra)
        return {
            **extra,
            "engine": caps.engine,
            "family": caps.family,
            "chunk_period_ms": caps.chunk_period_ms,
            "input_rates": list(self.view.input_rates),
            "engine_input_rate": caps.input_rate,
            "input_chunk_samples": caps.input_chunk_samples,
            "output_rate": caps.output_rate,
            "video": caps.video,
            "barge_in": caps.barge_in,
            "pause": caps.pause,
            "resume": caps.resume,
            "max_session_s": extra.get("max_session_s"),
            "demo_weights": caps.demo_weights,
            "modes": list(caps.modes),  # duplex, half_duplex, chat: what session.duplex.mode may ask for
            # what this session runs with, so a recording can name the exact persona version and voice
            "persona": {"id": self.view.persona_id, "version": self.view.persona_version},
            "voice": {"id": self.view.voice_id, "name": self.view.voice},
        }

    def session_object(self) -> dict[str, Any]:
        view = self.view
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": view.session_id,
            "model": view.model or (view.capabilities.engine if view.capabilities else None),
            "output_modalities": ["audio"],
            "instructions": view.instructions or "",
            "audio": {
                "input": {
                    "format": {"type": view.input_type, "rate": view.input_rate},
                    # a duplex model takes turns itself; half-duplex shows its server_vad settings (or null)
                    "turn_detection": view.turn_detection if view.mode == "half_duplex" else None,
                    "transcription": None,
                },
                "output": {"format": {"type": OUTPUT_FORMAT, "rate": view.output_rate}, "voice": view.voice},
            },
            "duplex": {
                "capabilities": self.capabilities(),
                "persona": view.instructions,
                "persona_id": view.persona_id,
                "persona_version": view.persona_version,
                "persona_name": view.persona_name,
                "voice": view.voice,
                "voice_id": view.voice_id,
                "resumed": view.resumed,
                "record": view.record,
                "binary_audio": view.binary_audio,
                "mode": view.mode,
                "max_response_s": view.max_response_s,
            },
        }

    def session_created(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"session": self.session_object()}
        if self.view.resumed:
            fields["resumed"] = True
        return self.event("session.created", **fields)

    # ---- responses ---------------------------------------------------------------------------

    def audio(self, out: AudioOut) -> list[Outgoing]:
        if out.epoch <= self._drop_through_epoch:
            return []
        events, response = self._response_for(out.epoch)
        if self.view.binary_audio:
            events.append(audio_frame(out.pcm16))
        else:
            events.append(
                self.event(
                    "response.output_audio.delta",
                    **self._where(response),
                    delta=base64.b64encode(out.pcm16).decode("ascii"),
                )
            )
        return events

    def text(self, out: TextOut) -> list[Outgoing]:
        if out.epoch <= self._drop_through_epoch or not out.text:
            return []
        events, response = self._response_for(out.epoch)
        response.transcript.append(out.text)
        response.transcript_chars += len(out.text)
        while response.transcript_chars > TRANSCRIPT_KEEP_CHARS and len(response.transcript) > 1:
            response.transcript_chars -= len(response.transcript.pop(0))
        events.append(self.event("response.output_audio_transcript.delta", **self._where(response), delta=out.text))
        return events

    def cancel(self) -> list[Outgoing]:
        """Barge-in: end the current response and drop late output of its epoch."""
        self._drop_through_epoch = max(self._drop_through_epoch, self._last_epoch)
        return self.end_response("cancelled")

    def end_response(self, status: str) -> list[Outgoing]:
        response, self._response = self._response, None
        if response is None:
            return []
        where = self._where(response)
        transcript = "".join(response.transcript)
        item = self._item(response, status="completed" if status == "completed" else "incomplete")
        item["content"] = [{"type": "output_audio", "transcript": transcript}]
        return [
            self.event("response.output_audio.done", **where),
            self.event("response.output_audio_transcript.done", **where, transcript=transcript),
            self.event("response.content_part.done", **where, part={"type": "audio", "transcript": transcript}),
            self.event("response.output_item.done", response_id=response.id, output_index=0, item=item),
            self.event("response.done", response=self._response_object(response, status=status, output=[item])),
        ]

    def open_response(self, epoch: int) -> list[Outgoing]:
        """A turn-based response begins (half-duplex): its events, even before any output."""
        if epoch <= self._drop_through_epoch:
            return []
        return self._response_for(epoch)[0]

    def end_response_of(self, epoch: int, status: str) -> list[Outgoing]:
        """A turn-based response ended: late output of its epoch (a unit already under way) is dropped,
        so it cannot open a second response."""
        self._drop_through_epoch = max(self._drop_through_epoch, epoch)
        if self._response is None or self._response.epoch != epoch:
            return []
        return self.end_response(status)

    def add_user_item(self, item_id: str) -> dict[str, Any]:
        """``conversation.item.added`` for a committed user audio turn (no transcript: none is made)."""
        previous, self._previous_item_id = self._previous_item_id, item_id
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        return self.event("conversation.item.added", previous_item_id=previous, item=item)

    def add_message_item(self, item: dict[str, Any]) -> list[Outgoing]:
        """``conversation.item.added`` then ``conversation.item.done`` for a message the client created (chat)."""
        previous, self._previous_item_id = self._previous_item_id, item["id"]
        return [
            self.event("conversation.item.added", previous_item_id=previous, item=item),
            self.event("conversation.item.done", previous_item_id=previous, item=item),
        ]

    @property
    def previous_item_id(self) -> str | None:
        return self._previous_item_id

    def _response_for(self, epoch: int) -> tuple[list[Outgoing], _Response]:
        """The response of ``epoch``, and the events that open it when it is new (an older one is closed first)."""
        self._last_epoch = max(self._last_epoch, epoch)
        if self._response is not None and self._response.epoch == epoch:
            return [], self._response
        events = self.end_response("completed")
        response = _Response(id=new_id("resp"), item_id=new_id("item"), epoch=epoch)
        self._response = response
        item = self._item(response, status="in_progress")
        events += [
            self.event("response.created", response=self._response_object(response, status="in_progress", output=[])),
            self.event("response.output_item.added", response_id=response.id, output_index=0, item=item),
            self.event("conversation.item.added", previous_item_id=self._previous_item_id, item=item),
            self.event(
                "response.content_part.added", **self._where(response), part={"type": "audio", "transcript": ""}
            ),
        ]
        self._previous_item_id = response.item_id
        return events, response

    @staticmethod
    def _where(response: _Response) -> dict[str, Any]:
        return {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}

    @staticmethod
    def _item(response: _Response, *, status: str) -> dict[str, Any]:
        return {
            "id": response.item_id,
            "object": "realtime.item",
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [],
        }

    def _response_object(self, response: _Response, *, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "object": "realtime.response",
            "id": response.id,
            "status": status,
            # An incomplete response stopped at its length cap (max_response_s / the chat reply's id cap).
            "status_details": {"type": "incomplete", "reason": "max_output_tokens"} if status == "incomplete" else None,
            "output": output,
            "conversation_id": self.view.session_id,
            "output_modalities": ["audio"],
            "audio": {
                "output": {"format": {"type": OUTPUT_FORMAT, "rate": self.view.output_rate}, "voice": self.view.voice}
            },
            "usage": None,
            "metadata": {"epoch": response.epoch},
        }
