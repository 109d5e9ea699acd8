"""Who may talk to the inference service: the shared secret's challenge-response, and the socket's private directory.

Only the web tier talks to the inference service, and only the web tier names users, so both ends of
every connection (unix socket or TCP) prove that they hold ``PARLEY_INFERENCE_TOKEN``, and neither
ever sends it. Frames are ``wire`` JSON frames; ``Nc``/``Ns`` are 32 random bytes from each side (hex):

    client -> {"op": "hello", "nonce": Nc}
    server -> {"op": "challenge", "nonce": Ns, "proof": HMAC-SHA256(token, LABEL "server" Nc Ns)}
    client    checks the server's proof; a peer that cannot show it gets nothing more (no proof, no call)
    client -> {"op": "proof", "proof": HMAC-SHA256(token, LABEL "client" Nc Ns)}
    server -> {"reply": 0, "ok": true}                    and the connection goes on as before
           or {"reply": 0, "error": {"code": "unauthenticated", ...}}   and the server closes it

Why this shape: whoever the client dials (a forged registry record, a squatted address) learns only a
random nonce, and the service proves itself before the client sends anything of a caller's. The role
is inside the MAC, so one side's proof is never valid as the other's (a reflected answer fails); each
side's fresh nonce is inside both MACs, so no proof can be replayed. Proofs are compared in constant
time. The server waits at most ``HANDSHAKE_TIMEOUT_S`` and reads at most ``MAX_HANDSHAKE_BYTES`` a
frame before it knows who is there, and on a unix socket also checks the peer's uid (``SO_PEERCRED``):
the service's own user or root. Every refusal is logged with its reason and the peer (never a secret);
so is a service that fails to prove itself, on the client's side (``inference.service_unproven``).
It authenticates, it does not encrypt: TCP between hosts belongs on a private network or a tunnel.

API: ``server_handshake(reader, writer, token)`` -> ``Peer`` or ``HandshakeRefused``;
``client_handshake(reader, writer, token, peer=...)`` / ``client_handshake_sync(sock, token, peer=...)``
raise ``ParleyError`` when either side is refused; ``private_socket_dir(path)``. The token itself is
``InferenceConfig.inference_token`` (``PARLEY_INFERENCE_TOKEN``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import secrets
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
HANDSHAKE_TIMEOUT_S = 5.0
MAX_HANDSHAKE_BYTES = 4096  # a handshake frame is ~200 bytes; a stranger must not make us buffer megabytes
NONCE_BYTES = 32
LABEL = b"parley-inference-handshake-v2\x00"  # what this MAC is for: never valid as a registry signature
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


def proof(token: str, role: bytes, client_nonce: bytes, server_nonce: bytes) -> str:
    """What ``role`` (b"client" or b"server") sends to show it holds ``token``, bound to both nonces."""
    message = LABEL + role + b"\x00" + client_nonce + server_nonce
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def proof_matches(given: object, expected: str) -> bool:
    """Constant-time; anything but a string (a peer's garbage) simply does not match."""
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


def _nonce(value: object) -> bytes:
    """A peer's nonce (hex of NONCE_BYTES bytes), or HandshakeRefused."""
    if not isinstance(value, str) or len(value) != 2 * NONCE_BYTES:
        raise HandshakeRefused("missing or malformed nonce")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise HandshakeRefused("missing or malformed nonce") from None


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
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                await _challenge_the_client(reader, writer, token)
        except TimeoutError:
            raise HandshakeRefused(f"handshake not finished within {HANDSHAKE_TIMEOUT_S:g} s") from None
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


async def _challenge_the_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str) -> None:
    hello = await _read_handshake_frame(reader, "the hello")
    if hello.get("op") != "hello":
        raise HandshakeRefused(f"first frame was {str(hello.get('op'))[:40]!r}, not a hello")
    if "token" in hello:  # a client of the old handshake, which sent the secret itself
        raise HandshakeRefused("a hello carrying the token itself (an old client); it must prove it instead")
    client_nonce = _nonce(hello.get("nonce"))
    server_nonce = secrets.token_bytes(NONCE_BYTES)
    challenge = {
        "op": "challenge",
        "nonce": server_nonce.hex(),
        "proof": proof(token, b"server", client_nonce, server_nonce),
    }
    writer.write(wire.json_frame(challenge))
    await writer.drain()
    answer = await _read_handshake_frame(reader, "the proof")
    if answer.get("op") != "proof":
        raise HandshakeRefused(f"second frame was {str(answer.get('op'))[:40]!r}, not a proof")
    if not proof_matches(answer.get("proof"), proof(token, b"client", client_nonce, server_nonce)):
        raise HandshakeRefused("wrong proof: the peer does not hold the token")


async def _read_handshake_frame(reader: asyncio.StreamReader, what: str) -> dict:
    try:
        length, kind = _FRAME_HEADER.unpack(await reader.readexactly(_FRAME_HEADER.size))
        if kind != wire.JSON or not 1 < length <= MAX_HANDSHAKE_BYTES:
            raise HandshakeRefused(f"{what} is not a small JSON frame")
        return wire.parse_json(await reader.readexactly(length - 1))
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise HandshakeRefused(f"closed before {what}") from exc
    except WireError as exc:
        raise HandshakeRefused(f"malformed frame for {what} ({exc})") from exc


async def _try_send(writer: asyncio.StreamWriter, obj: dict) -> None:
    try:
        writer.write(wire.json_frame(obj))
        await writer.drain()
    except ConnectionError:
        pass


# ---- client side ------------------------------------------------------------------------------
# The steps are plain functions over dicts, so the asyncio client and the blocking one run the same code.


def _client_hello(token: str | None) -> tuple[bytes, bytes]:
    """(this connection's nonce, the hello frame); a clear error when the token is not configured."""
    if not token:
        raise ParleyError(
            f"{TOKEN_ENV} is not set: the inference service refuses connections without its token",
            code="internal_error",
            error_type="server_error",
        )
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce, wire.json_frame({"op": "hello", "nonce": nonce.hex()})


def _answer_challenge(challenge: dict, token: str, client_nonce: bytes, peer: str) -> bytes:
    """The proof frame for a service that proved it holds ``token``; ParleyError (and a log line) otherwise."""
    if "error" in challenge:
        raise _refused()
    try:
        server_nonce = _nonce(challenge.get("nonce"))
    except HandshakeRefused:
        server_nonce = b""
    expected = proof(token, b"server", client_nonce, server_nonce) if server_nonce else ""
    if challenge.get("op") != "challenge" or not server_nonce or not proof_matches(challenge.get("proof"), expected):
        # Not the service, or not ours: a forged registry record, a squatted socket, another deployment.
        logger.warning(
            "inference.service_unproven: %s did not prove it holds %s; nothing was sent to it",
            peer,
            TOKEN_ENV,
            extra={"peer_address": peer},
        )
        raise ParleyError(
            f"the inference service at this address did not prove it holds {TOKEN_ENV}",
            code="internal_error",
            error_type="server_error",
        )
    return wire.json_frame({"op": "proof", "proof": proof(token, b"client", client_nonce, server_nonce)})


def _check_welcome(reply: dict) -> None:
    if reply.get("ok") is not True:
        raise _refused()


def _refused() -> ParleyError:
    return ParleyError(
        f"the inference service refused this process's {TOKEN_ENV}", code="internal_error", error_type="server_error"
    )


async def client_handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str | None, *, peer: str = "the peer"
) -> None:
    """Run the client's side; returns once both sides proved themselves, raises ParleyError otherwise."""
    nonce, hello = _client_hello(token)
    writer.write(hello)
    await writer.drain()
    writer.write(_answer_challenge(await _client_read(reader), token, nonce, peer))
    await writer.drain()
    _check_welcome(await _client_read(reader))


async def _client_read(reader: asyncio.StreamReader) -> dict:
    try:
        return await _read_handshake_frame(reader, "the answer")
    except HandshakeRefused:
        return {}  # dropped or garbled: no challenge, no welcome either


def client_handshake_sync(sock: socket.socket, token: str | None, *, peer: str = "the peer") -> None:
    """The blocking twin of ``client_handshake`` for a plain socket."""
    nonce, hello = _client_hello(token)
    sock.sendall(hello)
    sock.sendall(_answer_challenge(_client_read_sync(sock), token, nonce, peer))
    _check_welcome(_client_read_sync(sock))


def _client_read_sync(sock: socket.socket) -> dict:
    header = _recv_up_to(sock, _FRAME_HEADER.size)
    if len(header) < _FRAME_HEADER.size:
        return {}
    length, kind = _FRAME_HEADER.unpack(header)
    payload = _recv_up_to(sock, length - 1) if 1 < length <= MAX_HANDSHAKE_BYTES else b""
    if kind != wire.JSON or len(payload) != length - 1 or not payload:
        return {}
    try:
        return wire.parse_json(payload)
    except WireError:
        return {}


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
