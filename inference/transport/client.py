"""The web tier's client of ``python -m inference serve``, used when ``PARLEY_INFERENCE_URL`` is set.

- ``RemoteSessionHandle``: the ``SessionHandle`` over one connection (unix socket or TCP). Calls wait
  for the service's reply, so bad input raises ``ParleyError`` here exactly as in-process
  (``inference.session.local_handle.LocalHandle``). A connection lost before the session ended (the service
  died) ends the session with ``engine_failed`` and the reason, as does ``fail`` (the registry watch
  saw the service go silent).
- ``remote_occupancy``, ``remote_end_session``, ``remote_status``, ``remote_capabilities``: one-shot calls.

An address is ``unix:///path``, a bare socket path, or ``tcp://host:port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

from inference.audio import pcm
from inference.config import InferenceConfig
from inference.contracts import (
    ChatMessage,
    Closed,
    EngineCapabilities,
    ErrorEvent,
    ParleyError,
    Ready,
    SessionEvent,
    SessionRequest,
    TurnDetection,
    VoiceRef,
    WorkerSnapshot,
)
from inference.errors import WireError
from inference.session.handle_calls import NoArgumentCalls
from inference.status import ServiceStatus, status_from_dict
from inference.transport import auth, wire

logger = logging.getLogger(__name__)

GONE = "the inference service connection is closed"
CLOSE_DRAIN_S = 2.0
CONNECT_TIMEOUT_S = 5.0  # connect + handshake: a hung host must not hold a caller forever


class RemoteSessionHandle(NoArgumentCalls):
    """``SessionHandle`` backed by a connection to the inference service."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, service_id: str | None = None):
        self._reader, self._writer = reader, writer
        self.service_id = service_id  # the registry's name for the service, for failure messages
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._events: asyncio.Queue[SessionEvent | None] = asyncio.Queue()
        self._session_id: str | None = None
        self._closed = False
        self._events_done = False
        self._stream_ended = asyncio.Event()  # the service sent "end" (after Closed / Replaced)
        self._reader_task = asyncio.create_task(self._read_loop())

    @classmethod
    async def open(cls, address: str, request: SessionRequest, *, service_id: str | None = None) -> RemoteSessionHandle:
        reader, writer = await _connect(address)
        try:
            writer.write(wire.json_frame({"op": "open", "request": wire.request_to_dict(request)}))
            await writer.drain()
            await _read_reply(reader)
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer, service_id)

    @property
    def session_id(self) -> str | None:
        return self._session_id

    def events(self) -> AsyncIterator[SessionEvent]:
        """Iterate the events; cancelling one ``__anext__`` (e.g. under ``wait_for``) loses nothing."""
        return self

    def __aiter__(self) -> RemoteSessionHandle:
        return self

    async def __anext__(self) -> SessionEvent:
        if self._events_done:
            raise StopAsyncIteration
        event = await self._events.get()  # Queue.get is cancellation-safe
        if event is None:
            self._events_done = True
            raise StopAsyncIteration
        if isinstance(event, Ready):
            self._session_id = event.session_id
        return event

    async def update(
        self,
        *,
        persona: str | None = None,
        voice: VoiceRef | None = None,
        record: bool | None = None,
        record_video: bool | None = None,
    ) -> None:
        await self._call(
            "update", persona=persona, voice=wire.voice_to_dict(voice), record=record, record_video=record_video
        )

    async def append_audio(self, data: bytes, *, encoding: str, rate: int, answered: bool = True) -> None:
        """``answered=False`` sends with call id 0: the service reports a refusal as an ``ErrorEvent``.

        A reply per frame was 12.5 JSON replies a second per caller through the service's interpreter, the one
        its tick loop runs on (bench/notes/serving-e2e.md). What can be refused from the bytes alone (format,
        rate, a partial sample, NaN floats) is refused here, before sending, exactly as in-process.
        """
        if answered:
            call_id = next(self._ids)
            await self._send_and_wait(call_id, wire.audio_in_frame(call_id, encoding, rate, data))
            return
        if self._closed:
            raise ParleyError(GONE, code="session_not_ready")
        if encoding != "pcm16" or len(data) % 2:
            pcm.decode(data, encoding)  # raises the in-process session's invalid_audio / unsupported_audio_format
        try:
            self._writer.write(wire.audio_in_frame(wire.UNANSWERED, encoding, rate, data))
            await self._writer.drain()
        except ConnectionError as exc:
            raise ParleyError(GONE, code="session_not_ready") from exc

    async def append_image(self, data: bytes) -> None:
        call_id = next(self._ids)
        await self._send_and_wait(call_id, wire.id_frame(wire.IMAGE_IN, call_id, data))

    async def playback_ack(self, played_ms: float, heard: Sequence[tuple[int, int]] = ()) -> None:
        await self._call("playback_ack", played_ms=played_ms, heard=[list(pair) for pair in heard])

    async def set_mode(
        self, *, mode: str | None, turn_detection: TurnDetection | None, max_response_s: int | None = None
    ) -> None:
        detection = None if turn_detection is None else dataclasses.asdict(turn_detection)
        await self._call("set_mode", mode=mode, turn_detection=detection, max_response_s=max_response_s)

    async def add_chat_item(self, message: ChatMessage) -> None:
        await self._call("add_chat_item", message=wire.chat_message_to_dict(message))

    async def close(self, reason: str = "client_close") -> None:
        if not self._closed:
            with contextlib.suppress(ParleyError):  # already gone (replaced, closed): nothing to end
                await self._call("close", reason=reason)
            # Stay connected until the Closed event has arrived, as the in-process handle delivers it too.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stream_ended.wait(), CLOSE_DRAIN_S)
        await self._disconnect()

    async def detach(self) -> None:
        """Drop the connection; the service keeps the session for the grace period."""
        await self._disconnect()

    async def fail(self, reason: str) -> None:
        """The service is gone (missed heartbeats): end this session with ``engine_failed`` and ``reason``."""
        if self._closed:
            return
        self._closed = True
        self._end_failed(reason)
        await self._disconnect()

    def _end_failed(self, reason: str) -> None:
        self._events.put_nowait(ErrorEvent("engine_failed", reason, error_type="server_error"))
        self._events.put_nowait(Closed("engine_failed"))

    # ---- internals ----------------------------------------------------------------------------

    async def _forward(self, name: str) -> None:
        await self._call(name)

    async def _call(self, op: str, **args: Any) -> None:
        call_id = next(self._ids)
        await self._send_and_wait(call_id, wire.json_frame({"id": call_id, "op": op, "args": args}))

    async def _send_and_wait(self, call_id: int, data: bytes) -> None:
        if self._closed:
            raise ParleyError(GONE, code="session_not_ready")
        future = asyncio.get_running_loop().create_future()
        self._replies[call_id] = future
        try:
            self._writer.write(data)
            await self._writer.drain()
            await future
        except ConnectionError as exc:
            raise ParleyError(GONE, code="session_not_ready") from exc
        finally:
            self._replies.pop(call_id, None)

    async def _read_loop(self) -> None:
        ended = False  # the service said "end": the session finished normally (Closed / Replaced came)
        try:
            while (item := await wire.read_frame(self._reader)) is not None:
                kind, payload = item
                if kind == wire.JSON:
                    obj = wire.parse_json(payload)
                    if "reply" in obj:
                        self._resolve(obj)
                        continue
                    if obj.get("event") == "end":
                        ended = True
                        break  # Closed or Replaced came: this handle is finished, free the socket
                    self._events.put_nowait(wire.event_from_dict(obj))
                else:
                    self._events.put_nowait(wire.decode_event(kind, payload))
        except (WireError, ConnectionError):
            pass
        finally:
            if not ended and not self._closed:  # lost, not left: the service process died
                name = f" {self.service_id}" if self.service_id else ""
                self._end_failed(f"lost the connection to the inference service{name}")
            self._closed = True
            self._stream_ended.set()
            self._events.put_nowait(None)
            self._writer.close()
            for future in self._replies.values():
                if not future.done():
                    future.set_exception(ParleyError(GONE, code="session_not_ready"))

    def _resolve(self, obj: dict[str, Any]) -> None:
        future = self._replies.get(obj["reply"])
        if future is None or future.done():
            return
        if "error" in obj:
            future.set_exception(wire.error_from_dict(obj["error"]))
        else:
            future.set_result(obj.get("ok"))

    async def _disconnect(self) -> None:
        self._closed = True
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task


def _not_running(address: str) -> ParleyError:
    # The address is for the operator's log; callers (and the pages that show this) get no server paths.
    logger.warning("inference.unreachable: nothing answers at %s", address)
    return ParleyError("the inference service is not running", code="internal_error", error_type="server_error")


def _token() -> str | None:
    """This process's PARLEY_INFERENCE_TOKEN: every connection proves it holds it (and the service that it does)."""
    return InferenceConfig.from_env().inference_token


def _service_closed() -> ParleyError:
    return ParleyError("the inference service closed the connection", code="internal_error", error_type="server_error")


def _tcp_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``tcp://host:port`` address; None for a unix socket."""
    if not address.startswith("tcp://"):
        return None
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    return host.strip("[]"), int(port)


async def _connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that has passed the service's handshake (inference/transport/auth.py)."""
    endpoint = _tcp_endpoint(address)
    try:
        if endpoint is None:
            opening = asyncio.open_unix_connection(address.removeprefix("unix://"), limit=wire.MAX_FRAME_BYTES)
        else:
            opening = asyncio.open_connection(*endpoint, limit=wire.MAX_FRAME_BYTES)
        reader, writer = await asyncio.wait_for(opening, CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise _not_running(address) from exc
    try:
        await asyncio.wait_for(auth.client_handshake(reader, writer, _token(), peer=address), CONNECT_TIMEOUT_S)
    except TimeoutError as exc:
        writer.close()
        raise _not_running(address) from exc
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def _read_reply(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The JSON body of the service's reply to a call; an error reply raises its ``ParleyError``."""
    reply = await wire.read_frame(reader)
    if reply is None:
        raise _service_closed()
    body = wire.parse_json(reply[1])
    if "error" in body:
        raise wire.error_from_dict(body["error"])
    return body


async def one_shot(address: str, call: dict[str, Any]) -> Any:
    """Send one call on a fresh connection and return its ``ok`` value."""
    reader, writer = await _connect(address)
    try:
        writer.write(wire.json_frame(call))
        await writer.drain()
        body = await _read_reply(reader)
    finally:
        writer.close()
    return body.get("ok")


async def remote_occupancy(address: str) -> list[WorkerSnapshot]:
    return [wire.snapshot_from_dict(s) for s in await one_shot(address, {"op": "occupancy"})]


async def remote_end_session(address: str, session_id: str, reason: str) -> bool:
    return bool(await one_shot(address, {"op": "end_session", "session_id": session_id, "reason": reason}))


async def remote_status(address: str) -> ServiceStatus:
    """The service's status with its sessions and queue (the console of a single remote service)."""
    return status_from_dict(await one_shot(address, {"op": "status"}))


def remote_capabilities(address: str, timeout_s: float = 5.0) -> EngineCapabilities:
    """Blocking: the service's capabilities (for pages rendered outside an event loop)."""
    endpoint = _tcp_endpoint(address)
    family = socket.AF_UNIX if endpoint is None else socket.AF_INET6 if ":" in endpoint[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(address.removeprefix("unix://") if endpoint is None else endpoint)
        except OSError as exc:
            raise _not_running(address) from exc
        auth.client_handshake_sync(sock, _token(), peer=address)
        sock.sendall(wire.json_frame({"op": "capabilities"}))
        header = _recv_exactly(sock, 5)
        length = int.from_bytes(header[:4], "big")
        body = json.loads(_recv_exactly(sock, length - 1))
    return wire.capabilities_from_dict(body["ok"])


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise _service_closed()
        chunks += chunk
    return bytes(chunks)
