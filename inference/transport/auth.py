"""Who may talk to the inference service: the shared-token handshake and the socket's private directory.

Only the web tier talks to the inference service, and only the web tier names users, so every
connection, on the unix socket or over TCP, first proves it holds ``PARLEY_INFERENCE_TOKEN``:

    client -> {"op": "hello", "token": "<token>"}        (the first frame, a ``wire`` JSON frame)
    server -> {"reply": 0, "ok": true}                    and the connection goes on as before
           or {"reply": 0, "error": {"code": "unauthenticated", ...}}   and the server closes it

The server compares tokens with ``hmac.compare_digest``, waits at most ``HELLO_TIMEOUT_S`` and reads
at most ``MAX_HELLO_BYTES`` before it knows who is there, and on a unix socket also checks the peer's
uid (``SO_PEERCRED``): the service's own user or root. Every refusal is logged with its reason and
the peer (never the token).

API: ``server_handshake(reader, writer, token)`` -> ``Peer`` or ``HandshakeRefused``;
``client_handshake(reader, writer, token)`` / ``client_handshake_sync(sock, token)`` raise
``ParleyError`` when refused; ``private_socket_dir(path)``. The token itself is
``InferenceConfig.inference_token`` (``PARLEY_INFERENCE_TOKEN``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from inference.contracts import ParleyError
from inference.errors import WireError
from inference.transport import wire

logger = logging.getLogger(__name__)

TOKEN_ENV = "PARLEY_INFERENCE_TOKEN"  # named in messages; read by inference/config.py
HELLO_TIMEOUT_S = 5.0
MAX_HELLO_BYTES = 4096  # a hello is a few dozen bytes; a stranger must not make us buffer megabytes
_FRAME_HEADER = struct.Struct(">IB")  # wire's frame header: length (kind byte + payload), kind
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class HandshakeRefused(Exception):
    """The peer did not authenticate; ``reason`` says why (for the log, never for the peer)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Peer:
    """Who is on the other end: a unix peer's pid/uid (None where the transport cannot tell) or its address."""

    pid: int | None = None
    uid: int | None = None
    address: str | None = None


def tokens_match(given: object, expected: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def peer_of(writer: asyncio.StreamWriter) -> Peer:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX and hasattr(socket, "SO_PEERCRED"):
        pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        return Peer(pid=pid, uid=uid)
    address = writer.get_extra_info("peername")
    return Peer(address=str(address) if address else None)


def _allowed_uids() -> set[int]:
    return {os.geteuid(), 0}


# ---- server side ------------------------------------------------------------------------------


async def server_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str) -> Peer:
    """Authenticate a new connection; on refusal it answers, logs and raises ``HandshakeRefused``.

    The caller closes the connection after a refusal (and serves it as before after success).
    """
    peer = peer_of(writer)
    try:
        if peer.uid is not None and peer.uid not in _allowed_uids():
            raise HandshakeRefused(f"peer uid {peer.uid} is not the service's user")
        try:
            hello = await asyncio.wait_for(_read_hello(reader), HELLO_TIMEOUT_S)
        except TimeoutError:
            raise HandshakeRefused(f"no hello within {HELLO_TIMEOUT_S:g} s") from None
        if hello.get("op") != "hello":
            raise HandshakeRefused(f"first frame was {str(hello.get('op'))[:40]!r}, not a hello")
        if "token" not in hello:
            raise HandshakeRefused("no token")
        if not tokens_match(hello["token"], token):
            raise HandshakeRefused("wrong token")
    except HandshakeRefused as exc:
        logger.warning(
            "inference.auth_refused: %s (peer pid=%s uid=%s addr=%s)",
            exc.reason,
            peer.pid,
            peer.uid,
            peer.address,
            extra={"reason": exc.reason, "peer_pid": peer.pid, "peer_uid": peer.uid, "peer_address": peer.address},
        )
        error = {"message": "not authenticated", "code": "unauthenticated", "type": "invalid_request_error"}
        await _try_send(writer, {"reply": 0, "error": error})
        raise
    await _try_send(writer, {"reply": 0, "ok": True})
    return peer


async def _read_hello(reader: asyncio.StreamReader) -> dict:
    try:
        length, kind = _FRAME_HEADER.unpack(await reader.readexactly(_FRAME_HEADER.size))
        if kind != wire.JSON or not 1 < length <= MAX_HELLO_BYTES:
            raise HandshakeRefused("first frame is not a hello")
        return wire.parse_json(await reader.readexactly(length - 1))
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise HandshakeRefused("closed before the hello") from exc
    except WireError as exc:
        raise HandshakeRefused(f"malformed hello ({exc})") from exc


async def _try_send(writer: asyncio.StreamWriter, obj: dict) -> None:
    try:
        writer.write(wire.json_frame(obj))
        await writer.drain()
    except ConnectionError:
        pass


# ---- client side ------------------------------------------------------------------------------


def _hello(token: str | None) -> bytes:
    if not token:
        raise ParleyError(
            f"{TOKEN_ENV} is not set: the inference service refuses connections without its token",
            code="internal_error",
            error_type="server_error",
        )
    return wire.json_frame({"op": "hello", "token": token})


def _check_welcome(reply: dict) -> None:
    if reply.get("ok") is not True:
        raise ParleyError(
            f"the inference service refused this process's {TOKEN_ENV}",
            code="internal_error",
            error_type="server_error",
        )


async def client_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str | None) -> None:
    """Say hello with ``token`` and wait for the welcome; raises ParleyError when refused."""
    writer.write(_hello(token))
    await writer.drain()
    try:
        item = await wire.read_frame(reader)
    except (ConnectionError, WireError):
        item = None  # dropped without a word: no welcome either
    _check_welcome(wire.parse_json(item[1]) if item is not None and item[0] == wire.JSON else {})


def client_handshake_sync(sock: socket.socket, token: str | None) -> None:
    """The blocking twin of ``client_handshake`` for a plain socket."""
    sock.sendall(_hello(token))
    reply: dict = {}
    header = _recv_up_to(sock, _FRAME_HEADER.size)
    if len(header) == _FRAME_HEADER.size:
        length, kind = _FRAME_HEADER.unpack(header)
        payload = _recv_up_to(sock, length - 1) if 1 < length <= MAX_HELLO_BYTES else b""
        if kind == wire.JSON and len(payload) == length - 1:
            reply = wire.parse_json(payload)
    _check_welcome(reply)  # a closed or garbled answer is no welcome either


def _recv_up_to(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes, or fewer if the peer closed first."""
    data = b""
    while len(data) < n and (chunk := sock.recv(n - len(data))):
        data += chunk
    return data


# ---- the socket's directory -------------------------------------------------------------------


def private_socket_dir(path: Path) -> Path:
    """Create ``path`` as 0700, or accept an existing one only if this user owns it and nobody else can write it.

    A directory another user made (or one anybody may write, like ``/tmp`` itself) would let them
    replace the socket with their own and receive the web tier's token and its users' audio.
    """
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"{path} is not a directory")
    if info.st_uid != os.geteuid():
        raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to this user ({os.geteuid()})")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}); use a private dir")
    return path
