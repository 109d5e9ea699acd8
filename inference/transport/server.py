"""The socket face of an ``InferenceService``: its connections, served on a unix socket (and TCP).

Each connection is either one session handle (``open``, then calls and events until it ends) or a
single one-shot call (``capabilities``, ``occupancy``, ``status``, ``end_session``). Framing is
``inference.transport.wire``; the client side is ``inference.transport.client``. The unix socket is
always served; a ``Listeners`` (the process's ``inference.cluster.membership``) also takes the same
connections over TCP. The process itself, ``python -m inference serve``, is ``inference.serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from inference.contracts import ErrorEvent, ParleyError, VoiceRef
from inference.errors import WireError
from inference.service import InferenceService
from inference.session.handle_calls import NO_ARGUMENT_CALLS
from inference.session.local_handle import LocalHandle
from inference.status import ServiceStatus, status_to_dict
from inference.transport import auth, wire
from inference.voice_files import checked_voice

logger = logging.getLogger(__name__)

ConnectionHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Listeners(Protocol):
    """More ways in than the unix socket (a TCP listener, a heartbeat saying where it is), and the status
    the ``status`` call answers with. ``inference.cluster.membership.Membership`` is one."""

    def status(self) -> ServiceStatus: ...

    async def start(self, handler: ConnectionHandler) -> None: ...

    async def stop(self) -> None: ...


class Connection:
    """One socket connection: a session handle, or a single one-shot call."""

    def __init__(
        self,
        service: InferenceService,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        status: Callable[[], ServiceStatus] | None = None,
    ):
        self.service, self.reader, self.writer = service, reader, writer
        self.status = status  # the service's status with its sessions (the ``status`` call), if it has one
        self.handle: LocalHandle | None = None

    async def run(self) -> None:
        try:
            token = self.service.config.inference_token or ""  # serve() refuses to start without one
            try:
                await auth.server_handshake(self.reader, self.writer, token)
            except auth.HandshakeRefused:
                return  # answered and logged by the handshake
            first = await wire.read_frame(self.reader)
            if first is not None and first[0] == wire.JSON:
                await self._first_call(wire.parse_json(first[1]))
        except WireError as exc:
            logger.warning("service.bad_frame", extra={"detail": str(exc)})
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if self.handle is not None:
                await self.handle.detach()  # no-op if the session was closed or taken over
            self.writer.close()
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()

    async def _first_call(self, call: dict) -> None:
        op = call.get("op")
        if op == "capabilities":
            await self._send({"reply": 0, "ok": wire.capabilities_to_dict(self.service.capabilities)})
        elif op == "occupancy":
            snapshots = [wire.snapshot_to_dict(s) for s in self.service.occupancy()]
            await self._send({"reply": 0, "ok": snapshots})
        elif op == "end_session":
            ended = self.service.end_session(str(call.get("session_id")), str(call.get("reason", "admin_ended")))
            await self._send({"reply": 0, "ok": ended})
        elif op == "status" and self.status is not None:
            await self._send({"reply": 0, "ok": status_to_dict(self.status())})
        elif op == "open":
            try:
                request = wire.request_from_dict(call.get("request"))
                request = dataclasses.replace(request, voice=self._voice(request.voice))
                self.handle = await self.service.open_session(request)
            except ParleyError as exc:
                await self._send({"reply": 0, "error": wire.error_to_dict(exc)})
                return
            await self._send({"reply": 0, "ok": True})
            await self._serve_handle(self.handle)
        else:
            await self._send({"reply": 0, "error": {"message": f"unknown op {op!r}", "code": "unknown_event"}})

    async def _serve_handle(self, handle: LocalHandle) -> None:
        pump = asyncio.create_task(self._pump_events(handle))
        try:
            while (item := await wire.read_frame(self.reader)) is not None:
                await self._call(handle, *item)
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    async def _pump_events(self, handle: LocalHandle) -> None:
        with contextlib.suppress(ConnectionError):
            async for event in handle.events():
                self.writer.write(wire.event_frame(event))
                await self.writer.drain()
            await self._send({"event": "end"})

    async def _call(self, handle: LocalHandle, kind: int, payload: bytes) -> None:
        if kind == wire.AUDIO_IN:
            call_id, encoding, rate, data = wire.parse_audio_in(payload)
            if call_id == wire.UNANSWERED:
                try:
                    await handle.append_audio(data, encoding=encoding, rate=rate)
                except ParleyError as exc:  # no reply is awaited: the refusal travels as an event
                    self.writer.write(wire.event_frame(ErrorEvent(exc.code, exc.message, exc.error_type)))
                return
            await self._reply(call_id, handle.append_audio(data, encoding=encoding, rate=rate))
        elif kind == wire.IMAGE_IN:
            call_id, data = wire.parse_id_frame(payload)
            await self._reply(call_id, handle.append_image(data))
        elif kind == wire.JSON:
            call = wire.parse_json(payload)
            call_id, op, args = call.get("id"), call.get("op"), call.get("args") or {}
            if not isinstance(call_id, int) or not isinstance(args, dict):
                raise WireError("a call needs an integer id and object args")
            await self._reply(call_id, self._dispatch_checked(handle, op, args))
        else:
            raise WireError(f"unexpected frame kind {kind}")

    def _voice(self, voice: VoiceRef | None) -> VoiceRef | None:
        """Only files in the voices storage: a peer never makes the engine read a path of its choosing."""
        return checked_voice(voice, self.service.config.voice_roots)

    def _dispatch(self, handle: LocalHandle, op: object, args: dict):
        if op == "update":
            record, record_video = args.get("record"), args.get("record_video")
            return handle.update(
                persona=args.get("persona"),
                voice=self._voice(wire.voice_from_dict(args.get("voice"))),
                record=record if isinstance(record, bool) else None,
                record_video=record_video if isinstance(record_video, bool) else None,
            )
        if op in NO_ARGUMENT_CALLS or op == "detach":
            return getattr(handle, op)()
        if op == "set_mode":
            mode, seconds = args.get("mode"), args.get("max_response_s")
            return handle.set_mode(
                mode=mode if isinstance(mode, str) else None,  # type: ignore[arg-type] - the session checks it
                turn_detection=wire.turn_detection_from_dict(args.get("turn_detection")),
                max_response_s=seconds if isinstance(seconds, int) and not isinstance(seconds, bool) else None,
            )
        if op == "add_chat_item":
            return handle.add_chat_item(wire.chat_message_from_dict(args.get("message")))
        if op == "playback_ack":
            return handle.playback_ack(args.get("played_ms"), wire.heard_pairs(args.get("heard")))
        if op == "close":
            return handle.close(str(args.get("reason", "client_close")))
        raise ParleyError(f"unknown op {op!r}", code="unknown_event")

    async def _dispatch_checked(self, handle: LocalHandle, op: object, args: dict) -> None:
        await self._dispatch(handle, op, args)  # a refusal while building the call (a voice) becomes its reply

    async def _reply(self, call_id: int, call) -> None:
        try:
            await call
        except ParleyError as exc:
            await self._send({"reply": call_id, "error": wire.error_to_dict(exc)})
            return
        await self._send({"reply": call_id, "ok": True})

    async def _send(self, obj: dict) -> None:
        self.writer.write(wire.json_frame(obj))
        await self.writer.drain()


async def serve(
    service: InferenceService, socket_path: str, stop: asyncio.Event, membership: Listeners | None = None
) -> None:
    """Accept connections on ``socket_path`` (in a private directory), and on ``membership``'s TCP port
    with its heartbeat, until ``stop`` is set."""
    if not service.config.inference_token:
        raise SystemExit(
            f"{auth.TOKEN_ENV} is not set: the service authenticates every connection with it "
            "(the web tier needs the same value; make run generates var/inference-token)"
        )
    try:
        auth.private_socket_dir(Path(socket_path).parent)
    except PermissionError as exc:
        raise SystemExit(f"refusing to serve on {socket_path}: {exc}") from exc
    _remove_stale_socket(socket_path)
    status = membership.status if membership is not None else None

    def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        return Connection(service, reader, writer, status).run()

    server = await asyncio.start_unix_server(connection, path=socket_path, limit=wire.MAX_FRAME_BYTES)
    os.chmod(socket_path, 0o600)  # and its directory is 0700: only this user reaches it at all
    print(f"ready: serving {service.capabilities.engine!r} on unix://{socket_path}", flush=True)
    try:
        if membership is not None:
            await membership.start(connection)
        await stop.wait()
    finally:
        if membership is not None:
            await membership.stop()  # first: the registry stops sending calls here
        server.close()
        await service.stop()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)


def _remove_stale_socket(path: str) -> None:
    """Remove a socket file left by a dead service; refuse to start next to a live one."""
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        return
    finally:
        probe.close()
    raise SystemExit(f"another inference service is already listening on {path}")
