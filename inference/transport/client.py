"""The web tier's client of ``python -m inference serve``, used when ``PARLEY_INFERENCE_URL`` is set.

- ``RemoteSessionHandle``: the ``SessionHandle`` over a channel of this process's link to the service
  (``inference.transport.link``). Calls wait for the service's reply, so bad input raises ``ParleyError`` here
  exactly as in-process (``inference.session.local_handle.LocalHandle``). A link lost before the session ended
  (the service died) ends the session with ``engine_failed`` and the reason, as does ``fail`` (the registry
  watch saw the service go silent).
- ``remote_occupancy``, ``remote_end_session``, ``remote_status``, ``remote_capabilities``: one-shot calls, each
  on a connection of its own.

An address is ``unix:///path``, a bare socket path, or ``tcp://host:port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from inference.audio import pcm
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
from inference.transport.dial import connect, not_running, read_reply, service_closed, tcp_endpoint, token
from inference.transport.link import Link

GONE = "the inference service connection is closed"
CLOSE_DRAIN_S = 2.0


class RemoteSessionHandle(NoArgumentCalls):
    """``SessionHandle`` backed by a channel of this process's link to the inference service."""

    def __init__(self, link: Link, service_id: str | None = None):
        self._link = link
        self.channel = link.attach(self)
        self.service_id = service_id  # the registry's name for the service, for failure messages
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._events: asyncio.Queue[SessionEvent | None] = asyncio.Queue()
        self._session_id: str | None = None
        self._closed = False
        self._events_done = False
        self._direct: Callable[[SessionEvent], bool] | None = None  # see send_events_directly
        # The channel is finished: "end" came (after Closed / Replaced), or this handle let go of it.
        self._stream_ended = asyncio.Event()

    @classmethod
    async def open(cls, address: str, request: SessionRequest, *, service_id: str | None = None) -> RemoteSessionHandle:
        handle = cls(await Link.to(address), service_id)
        try:
            call_id = next(handle._ids)
            opening = {"id": call_id, "op": "open", "request": wire.request_to_dict(request)}
            await handle._send_and_wait(call_id, wire.json_frame(opening))
        except ParleyError as exc:
            handle._let_go()
            if exc.message == GONE:  # the link was lost under the open: as a service that does not answer
                raise service_closed() from exc
            raise
        except BaseException:
            handle._let_go()
            raise
        return handle

    @property
    def session_id(self) -> str | None:
        return self._session_id

    def events(self) -> AsyncIterator[SessionEvent]:
        """Iterate the events; cancelling one ``__anext__`` (e.g. under ``wait_for``) loses nothing."""
        return self

    def send_events_directly(self, take: Callable[[SessionEvent], bool] | None) -> None:
        self._direct = take

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
        self._send_audio(data, encoding=encoding, rate=rate)
        try:
            await self._link.drain()
        except ConnectionError as exc:
            raise ParleyError(GONE, code="session_not_ready") from exc

    def append_audio_now(self, data: bytes, *, encoding: str, rate: int) -> bool:
        if self._link.behind:
            return False  # append_audio waits for it (or says the link is lost)
        self._send_audio(data, encoding=encoding, rate=rate)
        return True

    def _send_audio(self, data: bytes, *, encoding: str, rate: int) -> None:
        if self._closed:
            raise ParleyError(GONE, code="session_not_ready")
        if encoding != "pcm16" or len(data) % 2:
            pcm.decode(data, encoding)  # raises the in-process session's invalid_audio / unsupported_audio_format
        self._link.send(self.channel, wire.audio_in_frame(wire.UNANSWERED, encoding, rate, data))

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
            # Keep the channel until the Closed event has arrived, as the in-process handle delivers it too.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stream_ended.wait(), CLOSE_DRAIN_S)
        self._detach_channel()

    async def detach(self) -> None:
        """Let go of the channel; the service keeps the session for the grace period."""
        self._detach_channel()

    async def fail(self, reason: str) -> None:
        """The service is gone (missed heartbeats): end this session with ``engine_failed`` and ``reason``."""
        if self._closed:
            return
        self._closed = True
        self._end_failed(reason)
        self._detach_channel()

    def _end_failed(self, reason: str) -> None:
        self._events.put_nowait(ErrorEvent("engine_failed", reason, error_type="server_error"))
        self._events.put_nowait(Closed("engine_failed"))

    # ---- the link's side ------------------------------------------------------------------------

    def on_frame(self, kind: int, payload: bytes) -> None:
        try:
            if kind == wire.JSON:
                obj = wire.parse_json(payload)
                if "reply" in obj:
                    self._resolve(obj)
                elif obj.get("event") == "end":  # Closed or Replaced came: this handle is finished
                    self._let_go()
                else:
                    self._put_event(wire.event_from_dict(obj))
            else:
                self._put_event(wire.decode_event(kind, payload))
        except WireError:
            self._end_failed(f"the inference service{self._name()} sent a frame this process cannot read")
            self._closed = True
            self._detach_channel()

    def _put_event(self, event: SessionEvent) -> None:
        """The service's event for ``events()``, or straight to the outbound lane while nothing is queued."""
        direct = self._direct
        if direct is not None and not self._events_done and self._events.empty() and direct(event):
            return
        self._events.put_nowait(event)

    def on_link_lost(self) -> None:
        """The connection to the service is gone: the service process died, unless this handle already let go."""
        if not self._closed:
            self._end_failed(f"lost the connection to the inference service{self._name()}")
        self._let_go()

    # ---- internals ------------------------------------------------------------------------------

    def _name(self) -> str:
        return f" {self.service_id}" if self.service_id else ""

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
            self._link.send(self.channel, data)
            await self._link.drain()
            await future
        except ConnectionError as exc:
            raise ParleyError(GONE, code="session_not_ready") from exc
        finally:
            self._replies.pop(call_id, None)

    def _resolve(self, obj: dict[str, Any]) -> None:
        future = self._replies.get(obj["reply"])
        if future is None or future.done():
            return
        if "error" in obj:
            future.set_exception(wire.error_from_dict(obj["error"]))
        else:
            future.set_result(obj.get("ok"))

    def _detach_channel(self) -> None:
        """Tell the service this channel is let go of (it keeps the session for its grace), unless it has ended."""
        if not self._stream_ended.is_set() and not self._link.lost:
            self._link.send(self.channel, wire.json_frame({"id": 0, "op": "detach"}))
        self._let_go()

    def _let_go(self) -> None:
        """The channel is finished: no more events, calls fail, the link forgets it."""
        if self._stream_ended.is_set():
            return
        self._closed = True
        self._stream_ended.set()
        self._link.forget(self.channel)
        self._events.put_nowait(None)
        for future in self._replies.values():
            if not future.done():
                future.set_exception(ParleyError(GONE, code="session_not_ready"))


async def one_shot(address: str, call: dict[str, Any]) -> Any:
    """Send one call on a fresh connection and return its ``ok`` value."""
    reader, writer = await connect(address)
    try:
        writer.write(wire.json_frame(call))
        await writer.drain()
        body = await read_reply(reader)
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
    endpoint = tcp_endpoint(address)
    family = socket.AF_UNIX if endpoint is None else socket.AF_INET6 if ":" in endpoint[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(address.removeprefix("unix://") if endpoint is None else endpoint)
        except OSError as exc:
            raise not_running(address) from exc
        auth.client_handshake_sync(sock, token(), peer=address)
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
            raise service_closed()
        chunks += chunk
    return bytes(chunks)
