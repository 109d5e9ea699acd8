"""The wire format of ``/v1/realtime``: client events (pydantic, discriminated on ``type``) and framing.

Parsing never raises anything but ``ProtocolError``, which carries the protocol error code, so
every malformed input becomes one typed ``error`` event. Unknown fields are ignored: a stock
OpenAI Realtime client sends many session fields a duplex model has no use for.

This is also the boundary where every value that later reaches a lookup, a conversion or the
database is made safe (``invalid_value`` with the field as ``param`` otherwise): text is valid
Unicode without NUL characters and bounded in length, ids are integers a database column holds or
ASCII digit strings, and integer literals are bounded in digits before Python converts them.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    TypeAdapter,
    ValidationError,
)

AUDIO_FRAME_KIND = 0x01  # binary frames: byte 0 = kind, rest = payload (both directions)

# OpenAI's format names and our extension, mapped to the facade's sample encodings.
INPUT_FORMATS = {"audio/pcm": "pcm16", "audio/pcm-f32": "f32"}
OUTPUT_FORMAT = "audio/pcm"  # pcm16 LE; the rate is the engine's output rate
MAX_EVENT_ID_CHARS = 200
MAX_NAME_CHARS = 200  # a voice name or a format type; voices are named in at most 100 characters
MAX_INSTRUCTIONS_CHARS = 20_000
MAX_ID = 2**63 - 1  # the largest primary key a database column (bigint) holds
Position = Annotated[NonNegativeInt, Field(le=MAX_ID)]  # a sample count on one connection
MAX_HEARD_PAIRS = 64  # a playback ack's instants: two a chunk played since the previous ack, acks ~0.5 s apart
# Longer integer literals are refused while parsing: Python converts at most 4300 digits, and no field
# takes more than MAX_ID (19 digits) anyway.
MAX_INTEGER_DIGITS = 100


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


class _OversizedInteger:
    """An integer literal of more than ``MAX_INTEGER_DIGITS`` digits: no field accepts it (invalid_value)."""

    __slots__ = ("digits",)

    def __init__(self, literal: str):
        self.digits = len(literal.lstrip("-"))

    def __repr__(self) -> str:
        return f"<integer of {self.digits} digits>"


def _parse_int(literal: str) -> int | _OversizedInteger:
    return int(literal) if len(literal) <= MAX_INTEGER_DIGITS else _OversizedInteger(literal)


def _clean_text(value: str) -> str:
    """Text a database, a tokenizer and a JSON encoder all take: no NUL, no lone UTF-16 surrogate."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("must be valid Unicode (it contains a lone UTF-16 surrogate)") from None
    return value


def _id_or_name(value: object) -> object:
    """A persona or voice reference: a positive integer id a database holds, or clean text.

    A digit string is an id written as text: its digits must be ASCII (``int()`` refuses or
    reinterprets others, such as superscripts). Anything else is left to the type check.
    """
    if isinstance(value, bool):
        raise ValueError("must be an id or a name, not a boolean")
    if isinstance(value, int) and not 0 < value <= MAX_ID:
        raise ValueError(f"an id must lie in [1, {MAX_ID}]")
    if isinstance(value, str):
        if len(value) > MAX_NAME_CHARS:
            raise ValueError(f"must be at most {MAX_NAME_CHARS} characters")
        _clean_text(value)
        if value.isdigit() and not value.isascii():
            raise ValueError("an id must be written with the digits 0-9")
    return value


CleanText = Annotated[str, AfterValidator(_clean_text)]
IdOrName = Annotated[int | str, BeforeValidator(_id_or_name)]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AudioFormat(_Lenient):
    type: CleanText = Field(max_length=MAX_NAME_CHARS)
    rate: int | None = Field(default=None, gt=0, le=384_000)


class TurnDetectionConfig(_Lenient):
    """OpenAI's ``turn_detection`` (GA: ``session.audio.input.turn_detection``); ranges as the inference side's."""

    type: Literal["server_vad", "semantic_vad"]
    threshold: float = Field(default=0.5, ge=0.0, le=1.0, allow_inf_nan=False)
    prefix_padding_ms: int = Field(default=300, ge=0, le=10_000)
    silence_duration_ms: int = Field(default=500, ge=0, le=10_000)
    create_response: bool = True
    interrupt_response: bool = True


class AudioInputConfig(_Lenient):
    format: AudioFormat | None = None
    turn_detection: TurnDetectionConfig | None = None  # explicit null: the client commits turns itself


class AudioOutputConfig(_Lenient):
    format: AudioFormat | None = None
    voice: IdOrName | None = None


class AudioConfig(_Lenient):
    input: AudioInputConfig | None = None
    output: AudioOutputConfig | None = None


class DuplexConfig(_Lenient):
    persona_id: IdOrName | None = None
    mode: Literal["duplex", "half_duplex", "chat"] | None = None
    max_response_s: int | None = Field(default=None, ge=1, le=600)  # half-duplex: a response's longest run
    record: bool | None = None
    record_video: bool | None = None  # keep the camera frames the model saw with the recording (default on)
    binary_audio: bool | None = None


class SessionConfig(_Lenient):
    instructions: CleanText | None = Field(default=None, max_length=MAX_INSTRUCTIONS_CHARS)
    audio: AudioConfig | None = None
    duplex: DuplexConfig | None = None


class _Event(_Lenient):
    event_id: CleanText | None = Field(default=None, max_length=MAX_EVENT_ID_CHARS)


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


class ConversationItemCreate(_Event):
    """Chat mode: a message for the conversation; its content is checked by ``chat_items``."""

    type: Literal["conversation.item.create"]
    item: dict[str, Any]
    previous_item_id: CleanText | None = Field(default=None, max_length=MAX_EVENT_ID_CHARS)


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
    # Extension: instants since the previous ack, each as [input_samples, output_samples]: where the page's
    # microphone stream (samples sent on this connection, at its input rate) and the agent's audio it played
    # (output samples received on this connection) stood at that instant. The live echo warning lines the two
    # tracks up with them (docs/protocol.md).
    heard: list[tuple[Position, Position]] = Field(default_factory=list, max_length=MAX_HEARD_PAIRS)


class SessionClose(_Event):
    type: Literal["session.close"]


ClientEvent = Annotated[
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | InputImageAppend
    | ConversationItemCreate
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


def session_input_format(
    config: SessionConfig, *, current: tuple[str, int], input_rates: tuple[int, ...], output_rate: int
) -> tuple[str, int]:
    """The (input type, input rate) after a ``session.update``, or ``unsupported_audio_format``.

    ``current`` is the session's format before the update; the output format, which the server
    fixes, is only checked. Nothing is changed here: the caller applies the result once the whole
    update is valid.
    """
    input_type, input_rate = current
    audio = config.audio
    if audio and audio.input and audio.input.format:
        fmt = audio.input.format
        if fmt.type not in INPUT_FORMATS:
            raise ProtocolError(
                "unsupported_audio_format",
                f"Input format {fmt.type!r} is not supported; use one of {sorted(INPUT_FORMATS)}.",
                param="session.audio.input.format.type",
            )
        input_type, input_rate = fmt.type, fmt.rate or 24_000
        if input_rate not in input_rates:
            raise ProtocolError(
                "unsupported_audio_format",
                f"Input rate {input_rate} is not supported; use one of {list(input_rates)}.",
                param="session.audio.input.format.rate",
            )
    if audio and audio.output and audio.output.format:
        fmt = audio.output.format
        if fmt.type != OUTPUT_FORMAT or fmt.rate not in (None, output_rate):
            raise ProtocolError(
                "unsupported_audio_format",
                f"Output is {OUTPUT_FORMAT} at {output_rate} Hz.",
                param="session.audio.output.format",
            )
    return input_type, input_rate


def turn_settings(config: SessionConfig, *, served: bool = True) -> tuple[bool, TurnDetectionConfig | None]:
    """(whether the update names ``turn_detection`` at all, its value). ``served``: the engine takes turns
    (half-duplex), so the value matters and ``semantic_vad`` is refused; a duplex-only engine ignores any
    ``turn_detection``, so stock clients that always send ``semantic_vad`` (the agents SDK) still work."""
    audio_input = config.audio.input if config.audio else None
    if audio_input is None or "turn_detection" not in audio_input.model_fields_set:
        return False, None
    detection = audio_input.turn_detection
    if served and detection is not None and detection.type != "server_vad":
        raise ProtocolError(
            "unsupported_turn_detection",
            f"turn_detection type {detection.type!r} is not served; use server_vad or null.",
            param="session.audio.input.turn_detection.type",
        )
    return True, detection


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
        raw = json.loads(text, parse_int=_parse_int)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError("invalid_json", f"The frame is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ProtocolError("invalid_json", "An event must be a JSON object.")
    event_id = _echoable_event_id(raw.get("event_id"))
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


def _echoable_event_id(value: object) -> str | None:
    """The client's event_id when it can be echoed in an error as is (a bad one is not repeated back)."""
    if not isinstance(value, str) or len(value) > MAX_EVENT_ID_CHARS:
        return None
    try:
        return _clean_text(value)
    except ValueError:
        return None


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
