"""The wire format of ``/v1/realtime``: client events (pydantic, discriminated on ``type``) and framing.

Parsing never raises anything but ``ProtocolError``, which carries the protocol error code, so
every malformed input becomes one typed ``error`` event. Unknown fields are ignored: a stock
OpenAI Realtime client sends many session fields a duplex model has no use for.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

AUDIO_FRAME_KIND = 0x01  # binary frames: byte 0 = kind, rest = payload (both directions)

# OpenAI's format names and our extension, mapped to the facade's sample encodings.
INPUT_FORMATS = {"audio/pcm": "pcm16", "audio/pcm-f32": "f32"}
OUTPUT_FORMAT = "audio/pcm"  # pcm16 LE; the rate is the engine's output rate


class ProtocolError(Exception):
    """A client event the server rejects; becomes an ``error`` event and the session goes on."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        event_id: str | None = None,
        error_type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id
        self.error_type = error_type


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AudioFormat(_Lenient):
    type: str
    rate: int | None = Field(default=None, gt=0, le=384_000)


class AudioInputConfig(_Lenient):
    format: AudioFormat | None = None


class AudioOutputConfig(_Lenient):
    format: AudioFormat | None = None
    voice: int | str | None = None


class AudioConfig(_Lenient):
    input: AudioInputConfig | None = None
    output: AudioOutputConfig | None = None


class DuplexConfig(_Lenient):
    persona_id: int | str | None = None
    record: bool | None = None
    binary_audio: bool | None = None


class SessionConfig(_Lenient):
    instructions: str | None = Field(default=None, max_length=20_000)
    audio: AudioConfig | None = None
    duplex: DuplexConfig | None = None


class _Event(_Lenient):
    event_id: str | None = Field(default=None, max_length=200)


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionConfig


class InputAudioBufferAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class InputAudioBufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class InputImageAppend(_Event):
    type: Literal["input_image.append"]
    image: str


class ResponseCreate(_Event):
    type: Literal["response.create"]


class ResponseCancel(_Event):
    type: Literal["response.cancel"]


class ResponseForceListen(_Event):
    type: Literal["response.force_listen"]


class SessionPause(_Event):
    type: Literal["session.pause"]


class SessionResume(_Event):
    type: Literal["session.resume"]


class PlaybackAck(_Event):
    type: Literal["playback.ack"]
    played_ms: float = Field(ge=0, allow_inf_nan=False)


class SessionClose(_Event):
    type: Literal["session.close"]


ClientEvent = Annotated[
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | InputImageAppend
    | ResponseCreate
    | ResponseCancel
    | ResponseForceListen
    | SessionPause
    | SessionResume
    | PlaybackAck
    | SessionClose,
    Field(discriminator="type"),
]
_CLIENT_EVENT = TypeAdapter(ClientEvent)
CLIENT_EVENT_TYPES = frozenset(
    model.model_fields["type"].annotation.__args__[0]  # the Literal's single value
    for model in ClientEvent.__origin__.__args__  # type: ignore[attr-defined]
)


def check_size(payload: str | bytes, max_bytes: int) -> None:
    """Refuse events above the server's message limit before parsing them."""
    size = len(payload)
    if isinstance(payload, str) and size * 4 > max_bytes:  # only encode when it could be over
        size = len(payload.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ProtocolError("event_too_large", f"Event of {size} bytes exceeds the limit of {max_bytes} bytes.")


def parse_client_event(text: str) -> Any:
    """Parse one text frame into a client event model, or raise ``ProtocolError``."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError("invalid_json", f"The frame is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ProtocolError("invalid_json", "An event must be a JSON object.")
    event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    event_type = raw.get("type")
    if not isinstance(event_type, str) or event_type not in CLIENT_EVENT_TYPES:
        raise ProtocolError(
            "unknown_event", f"Unknown event type {str(event_type)[:100]!r}.", param="type", event_id=event_id
        )
    try:
        return _CLIENT_EVENT.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"][1:])  # drop the discriminator tag
        raise ProtocolError(
            "invalid_value", f"Invalid {event_type}: {where}: {first['msg']}", param=where or None, event_id=event_id
        ) from None


def decode_base64(data: str, *, code: str, param: str, event_id: str | None) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(code, f"{param} is not valid base64.", param=param, event_id=event_id) from None


def split_binary_frame(frame: bytes) -> bytes:
    """The audio payload of a binary frame, or ``ProtocolError`` for an unknown kind."""
    if not frame:
        raise ProtocolError("invalid_audio", "Empty binary frame.")
    if frame[0] != AUDIO_FRAME_KIND:
        raise ProtocolError("unknown_event", f"Unknown binary frame kind 0x{frame[0]:02x}.", param="kind")
    return frame[1:]


def audio_frame(pcm16: bytes) -> bytes:
    return bytes([AUDIO_FRAME_KIND]) + pcm16
