"""Framing and event codec for the service socket (web tier <-> ``python -m inference serve``).

A frame is a 4-byte big-endian length of what follows, one kind byte, and a payload:

- ``JSON``: a UTF-8 JSON object (calls, replies, events).
- ``AUDIO_IN``: call id (u32), encoding (u8: 0 pcm16, 1 f32), rate (u32), raw samples. Call id 0
  (``UNANSWERED``) asks for no reply: a refusal comes back as an ``ErrorEvent`` among the events.
- ``AUDIO_OUT``: epoch (u32), pcm16 samples; the event ``AudioOut`` without a JSON round trip.
- ``IMAGE_IN``: call id (u32), JPEG/PNG bytes.
- ``CHANNEL``: channel (u32) and one whole frame of the kinds above: a session's frame on a link.

A one-shot connection carries a single ``occupancy`` / ``end_session`` / ``capabilities`` / ``status``
call. A link (first call ``link``) carries a web process's sessions, each on a channel of its own
(``inference.transport.link`` and ``inference.transport.service_link``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import struct
import typing
from pathlib import Path
from typing import Any

from inference.audio import pcm
from inference.contracts import (
    AudioOut,
    ChatMessage,
    Closed,
    Decision,
    EngineCapabilities,
    ErrorEvent,
    Metrics,
    Mode,
    ParleyError,
    Paused,
    Prefill,
    Queued,
    Ready,
    Replaced,
    ResponseEnded,
    ResponseStarted,
    Resumed,
    SessionEvent,
    SessionRequest,
    SlotSnapshot,
    SpeechStarted,
    SpeechStopped,
    TextOut,
    TurnCommitted,
    TurnDetection,
    VoiceRef,
    WorkerSnapshot,
)
from inference.errors import WireError

JSON, AUDIO_IN, AUDIO_OUT, IMAGE_IN, CHANNEL = 1, 2, 3, 4, 5
UNANSWERED = 0  # an AUDIO_IN call id: no reply (ids of answered calls start at 1)
MAX_FRAME_BYTES = 4 * 1024 * 1024
ENCODINGS = ("pcm16", "f32")
_HEADER = struct.Struct(">IB")
_CHANNEL = struct.Struct(">IBI")  # the link's header: length, CHANNEL, channel; then the session's whole frame
CHANNEL_OVERHEAD = _CHANNEL.size - 4  # what a channel adds to the length its frame's header counts
_AUDIO_IN = struct.Struct(">IBI")
_U32 = struct.Struct(">I")
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))  # one encoder: json.dumps builds one a call (~2.5 us)

EVENT_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        Queued,
        Ready,
        Prefill,
        AudioOut,
        TextOut,
        Decision,
        Metrics,
        Paused,
        Resumed,
        Replaced,
        Closed,
        ErrorEvent,
        SpeechStarted,
        SpeechStopped,
        TurnCommitted,
        ResponseStarted,
        ResponseEnded,
    )
}


# ---- frames -------------------------------------------------------------------------------------


def frame(kind: int, payload: bytes) -> bytes:
    if len(payload) + 1 > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(payload) + 1, kind) + payload


def json_frame(obj: dict[str, Any]) -> bytes:
    return frame(JSON, _COMPACT_JSON.encode(obj).encode())


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """The next (kind, payload), or None at a clean end of stream. Raises WireError on garbage."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise WireError("connection closed inside a frame header") from exc
        return None
    length, kind = _HEADER.unpack(header)
    if not 1 <= length <= MAX_FRAME_BYTES + _HEADER.size + CHANNEL_OVERHEAD:
        raise WireError(f"bad frame length {length}")
    try:
        payload = await reader.readexactly(length - 1)
    except asyncio.IncompleteReadError as exc:
        raise WireError("connection closed inside a frame") from exc
    return kind, payload


def channel_header(channel: int, inner: bytes) -> bytes:
    """What goes before ``inner`` (a whole frame) to carry it on ``channel``; written apart, so no frame is copied."""
    return _CHANNEL.pack(len(inner) + CHANNEL_OVERHEAD, CHANNEL, channel)


def split_channel(payload: bytes) -> tuple[int, int, bytes]:
    """(channel, kind, payload) of a ``CHANNEL`` frame's payload; raises WireError when the frame inside is cut."""
    if len(payload) < _U32.size + _HEADER.size:
        raise WireError("short channel frame")
    channel = _U32.unpack_from(payload)[0]
    length, kind = _HEADER.unpack_from(payload, _U32.size)
    if length != len(payload) - _U32.size - 4:
        raise WireError("a channel's frame does not fill its channel frame")
    return channel, kind, payload[_U32.size + _HEADER.size :]


def parse_json(payload: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"bad JSON frame: {exc}") from exc
    if not isinstance(obj, dict):
        raise WireError("a JSON frame must hold an object")
    return obj


def audio_in_frame(call_id: int, encoding: str, rate: int, data: bytes) -> bytes:
    pcm.check_format(encoding, rate)  # the same refusal the in-process session gives, before anything is sent
    return frame(AUDIO_IN, _AUDIO_IN.pack(call_id, ENCODINGS.index(encoding), rate) + data)


def parse_audio_in(payload: bytes) -> tuple[int, str, int, bytes]:
    if len(payload) < _AUDIO_IN.size:
        raise WireError("short audio frame")
    call_id, enc, rate = _AUDIO_IN.unpack_from(payload)
    if enc >= len(ENCODINGS):
        raise WireError(f"unknown audio encoding byte {enc}")
    return call_id, ENCODINGS[enc], rate, payload[_AUDIO_IN.size :]


def id_frame(kind: int, call_id: int, data: bytes) -> bytes:
    return frame(kind, _U32.pack(call_id) + data)


def parse_id_frame(payload: bytes) -> tuple[int, bytes]:
    if len(payload) < _U32.size:
        raise WireError("short frame")
    return _U32.unpack_from(payload)[0], payload[_U32.size :]


# ---- events -------------------------------------------------------------------------------------


def event_frame(event: SessionEvent) -> bytes:
    if isinstance(event, AudioOut):
        return frame(AUDIO_OUT, _U32.pack(event.epoch) + event.pcm16)
    return json_frame({"event": type(event).__name__, **_plain_fields(event)})


def decode_event(kind: int, payload: bytes) -> SessionEvent:
    if kind == AUDIO_OUT:
        epoch, pcm16 = parse_id_frame(payload)
        return AudioOut(pcm16=pcm16, epoch=epoch)
    if kind != JSON:
        raise WireError(f"unexpected frame kind {kind} for an event")
    return event_from_dict(parse_json(payload))


def event_from_dict(obj: dict[str, Any]) -> SessionEvent:
    fields = dict(obj)
    cls = EVENT_TYPES.get(fields.pop("event", None))
    if cls is None:
        raise WireError(f"unknown event {obj.get('event')!r}")
    try:
        if cls is Ready:
            fields["capabilities"] = capabilities_from_dict(fields["capabilities"])
        return cls(**fields)
    except (KeyError, TypeError) as exc:
        raise WireError(f"malformed {cls.__name__} event: {exc}") from exc


def capabilities_to_dict(caps: EngineCapabilities) -> dict[str, Any]:
    return _plain(dataclasses.asdict(caps))


def capabilities_from_dict(obj: dict[str, Any]) -> EngineCapabilities:
    if "modes" in obj:  # JSON has no tuples
        obj = {**obj, "modes": tuple(obj["modes"])}
    return EngineCapabilities(**obj)


def chat_message_to_dict(message: ChatMessage) -> dict[str, Any]:
    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode("ascii")

    return {
        "role": message.role,
        "text": message.text,
        "image": b64(message.image),
        "audio": b64(message.audio),
        "audio_rate": message.audio_rate,
    }


def chat_message_from_dict(obj: Any) -> ChatMessage:
    """A chat message from a peer; the session checks its content (sizes, image, audio) itself."""
    if (
        not isinstance(obj, dict)
        or obj.get("role") not in ("user", "assistant")
        or not isinstance(obj.get("text"), str)
    ):
        raise ParleyError("a chat message needs a role and text", code="invalid_value", param="item")
    rate = obj.get("audio_rate", 16_000)
    if not isinstance(rate, int) or isinstance(rate, bool):
        raise ParleyError("audio_rate must be an integer", code="invalid_value", param="audio_rate")

    def unb64(value: Any, param: str) -> bytes | None:
        if value is None:
            return None
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise ParleyError(f"{param} is not valid base64", code="invalid_value", param=param) from None

    return ChatMessage(
        obj["role"], obj["text"], unb64(obj.get("image"), "image"), unb64(obj.get("audio"), "audio"), rate
    )


def heard_pairs(obj: Any) -> list[tuple[int, int]]:
    """A playback ack's instants, each (input_samples, output_samples); what is not two non-negative integers is
    left out (the web tier checked them already)."""
    if not isinstance(obj, list):
        return []
    ok = [p for p in obj if isinstance(p, list | tuple) and len(p) == 2]
    return [(p[0], p[1]) for p in ok if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in p)]


def turn_detection_from_dict(obj: Any) -> TurnDetection | None:
    """A peer's ``server_vad`` settings (None: the client commits turns itself)."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise WireError("turn_detection must be an object or null")
    try:
        return TurnDetection(**obj)
    except TypeError as exc:
        raise WireError(f"malformed turn_detection: {exc}") from exc


# ---- requests and snapshots ---------------------------------------------------------------------


def request_to_dict(request: SessionRequest) -> dict[str, Any]:
    return _plain(dataclasses.asdict(request))


def voice_to_dict(voice: VoiceRef | None) -> dict[str, Any] | None:
    return None if voice is None else _plain(dataclasses.asdict(voice))


def voice_from_dict(obj: dict[str, Any] | None) -> VoiceRef | None:
    if obj is None:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("voice_id"), str):
        raise WireError("a voice needs a string voice_id")
    path = obj.get("path")
    return VoiceRef(voice_id=obj["voice_id"], path=Path(path) if path else None)


def request_from_dict(obj: Any) -> SessionRequest:
    if not isinstance(obj, dict) or not isinstance(obj.get("user_key"), str):
        raise WireError("an open call needs a request with a string user_key")
    return SessionRequest(
        user_key=obj["user_key"],
        model=obj.get("model"),
        persona=obj.get("persona"),
        voice=voice_from_dict(obj.get("voice")),
        record=bool(obj.get("record", True)),
        mode=_mode(obj.get("mode")),
    )


def _mode(value: Any) -> Mode | None:
    if value is None or value in typing.get_args(Mode):
        return value
    raise WireError(f"unknown session mode {str(value)[:50]!r}")


def snapshot_to_dict(snapshot: WorkerSnapshot) -> dict[str, Any]:
    return _plain(dataclasses.asdict(snapshot))


def snapshot_from_dict(obj: dict[str, Any]) -> WorkerSnapshot:
    fields = dict(obj)
    fields["slots"] = tuple(SlotSnapshot(**s) for s in fields["slots"])
    fields["recent_tick_ms"] = tuple(fields.get("recent_tick_ms", ()))
    return WorkerSnapshot(**fields)


def error_to_dict(exc: ParleyError) -> dict[str, Any]:
    return {"message": exc.message, "code": exc.code, "error_type": exc.error_type, "param": exc.param}


def error_from_dict(obj: dict[str, Any]) -> ParleyError:
    return ParleyError(
        str(obj.get("message", "error")),
        code=str(obj.get("code", "internal_error")),
        error_type=str(obj.get("error_type", "server_error")),
        param=obj.get("param"),
    )


def _plain_fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields made JSON-safe as ``_plain`` does, without ``asdict``'s deep copy first: that copy was
    most of an event's cost (a tick's text and a second's metrics for every call)."""
    names = _FIELD_NAMES.get(type(obj))
    if names is None:
        names = _FIELD_NAMES[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
    return {name: _plain(getattr(obj, name)) for name in names}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(value: Any) -> Any:
    """Make dataclass dicts JSON-safe: Paths to str, tuples and mappings to lists and dicts, dataclasses to dicts."""
    if value is None or isinstance(value, str | int | float):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain_fields(value)
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
