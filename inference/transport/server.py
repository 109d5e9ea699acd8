"""The socket face of an ``InferenceService``: its connections, served on a unix socket (and TCP).

Each connection is either a web process's link (``link``, then its sessions each on a channel:
``inference.transport.service_link``) or a single one-shot call (``capabilities``, ``occupancy``, ``status``,
``end_session``). Framing is ``inference.transport.wire``; the client side is ``inference.transport.client``
and ``inference.transport.link``. The unix socket is
always served; a ``Listeners`` (the process's ``inference.cluster.membership``) also takes the same
connections over TCP. The process itself, ``python -m inference serve``, is ``inference.serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from inference.errors import WireError
from inference.service import InferenceService
from inference.status import ServiceStatus, status_to_dict
from inference.transport import auth, wire
from inference.transport.service_link import ServiceLink

logger = logging.getLogger(__name__)

ConnectionHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Listeners(Protocol):
    """More ways in than the unix socket (a TCP listener, a heartbeat saying where it is), and the status
    the ``status`` call answers with. ``inference.cluster.membership.Membership`` is one."""

    def status(self) -> ServiceStatus: ...

    async def start(self, handler: ConnectionHandler) -> None: ...

    async def stop(self) -> None: ...


class Connection:
    """One socket connection: a link, or a single one-shot call."""

    def __init__(
        self,
        service: InferenceService,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        status: Callable[[], ServiceStatus] | None = None,
    ):
        self.service, self.reader, self.writer = service, reader, writer
        self.status = status  # the service's status with its sessions (the ``status`` call), if it has one

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
        elif op == "link":
            await self._send({"reply": 0, "ok": True})
            await ServiceLink(self.service, self.reader, self.writer).run()
        else:
            await self._send({"reply": 0, "error": {"message": f"unknown op {op!r}", "code": "unknown_event"}})

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
