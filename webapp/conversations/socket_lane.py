"""A realtime socket's messages straight onto daphne's transport: one WebSocket frame header and one write each.

A call gets 12.5 binary audio frames a second, so one web process at 200 callers sends 2 500, plus each call's
JSON events. Through the ordinary path each message went through channels' ``send`` (with the session
middleware's wrapper), daphne's reply routing (``Server.handle_reply`` -> ``WebSocketProtocol.handle_reply`` ->
``serverSend``) and autobahn's ``sendMessage`` -> ``sendFrame`` -> ``sendData``, which builds its debug-log
arguments with debug logging off. The bytes that path writes are fixed by RFC 6455 (5.2): a final text or
binary frame, unmasked from a server, its payload length in 7, 16 or 64 bits, then the payload. This lane
writes exactly those bytes to the connection's transport itself: at 120 echo callers on 2 cores, one daphne
used 10-14 % less CPU and the server-added latency p99 fell from 196-204 to 145-155 ms
(bench/notes/serving-e2e.md).

It is used only while the connection is in the plain state where both paths write the same bytes: daphne's
autobahn protocol, open, no message half sent, nothing queued in autobahn (its queue keeps writes in order),
no per-message compression, server frames unmasked. Otherwise a send returns False and the message takes the
ordinary path, so the closing handshake, a dropped connection (autobahn's ``Disconnected``) and order (every
message of a socket goes out under one lock) stay the frameworks'.

A lane frame goes to the socket at once when the connection has nothing waiting to be written. Twisted's
``write`` only buffers: it registers the socket for writability (an ``epoll_ctl``), and a later turn of the loop
sends the bytes and unregisters it (another), every call through Twisted's log and context wrappers. For a
message that fits the kernel's send buffer, which is every message of a call whose client keeps up, that is two
system calls and a turn of the loop for nothing: a py-spy of one daphne at 150 echo callers on 2 cores found 9 % of
its interpreter there. Whatever is not sent at once (a full kernel buffer, a slow client) goes to Twisted's
buffer behind nothing, as before, and a socket error is left for Twisted's own write to meet, so a dropped connection
closes the way it always did.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

from webapp.operations.metrics import SOCKET_WRITES

SCOPE_KEY = "parley.server_send"  # the server's own ``send`` for this socket, put there by ServerSendMiddleware

FINAL_TEXT, FINAL_BINARY = 0x81, 0x82  # FIN + opcode 1 or 2


def frame_header(length: int, first_byte: int = FINAL_BINARY) -> bytes:
    """The header of a final, unmasked frame with ``length`` payload bytes (RFC 6455 5.2)."""
    if length <= 125:
        return bytes((first_byte, length))
    if length <= 0xFFFF:
        return struct.pack("!BBH", first_byte, 126, length)
    return struct.pack("!BBQ", first_byte, 127, length)


class SocketLane:
    """Writes text and binary messages to one daphne WebSocket connection's transport (see the module's note)."""

    def __init__(self, protocol: Any):
        self.protocol = protocol

    @classmethod
    def for_scope(cls, scope: dict) -> SocketLane | None:
        """The lane for the socket of ``scope``, or None when the server is not daphne's autobahn protocol."""
        protocol = _daphne_protocol(scope.get(SCOPE_KEY))
        return cls(protocol) if protocol is not None else None

    def send(self, message: bytes | str) -> bool:
        """Write ``message`` as one binary (bytes) or text (str) message; False when the ordinary path must."""
        return self.send_binary(message) if isinstance(message, bytes) else self.send_text(message)

    def send_binary(self, payload: bytes) -> bool:
        """Write ``payload`` as one binary message; False (nothing written) when the ordinary path must send it."""
        return self._write(payload, FINAL_BINARY)

    def send_text(self, text: str) -> bool:
        """Write ``text`` as one text message (UTF-8); False when the ordinary path must send it."""
        return self._write(text.encode("utf-8"), FINAL_TEXT)

    def writable(self) -> bool:
        """Whether a message written now takes the lane: the connection is in the plain state (the module's note)."""
        p = self.protocol
        return not (
            p.state != p.STATE_OPEN
            or p.send_state != p.SEND_STATE_GROUND
            or p.send_queue
            or p._perMessageCompress is not None
            or p.maskServerFrames
            or p.transport is None
        )

    def _write(self, payload: bytes, first_byte: int) -> bool:
        if not self.writable():
            return False
        write_now(self.protocol.transport, frame_header(len(payload), first_byte) + payload)
        return True


def write_now(transport: Any, data: bytes) -> None:
    """Write ``data`` to a Twisted TCP transport: to its socket at once when nothing of the connection is waiting
    (the module's note), what the kernel does not take through the transport's own buffer, after it."""
    sock = getattr(transport, "socket", None)
    if sock is not None and _nothing_waiting(transport):
        try:
            sent = sock.send(data)
        except OSError:  # full (EAGAIN), interrupted, or the connection is gone: Twisted's write finds out which
            sent = 0
        if sent == len(data):
            SOCKET_WRITES["at_once"] += 1
            return
        data = data[sent:]
    SOCKET_WRITES["buffered"] += 1
    transport.write(data)


def _nothing_waiting(transport: Any) -> bool:
    """Whether a plain TCP transport is connected, open for writing, and holds no unsent bytes (Twisted's
    ``FileDescriptor``: ``dataBuffer`` from ``offset``, then ``_tempDataBuffer``), so bytes sent now keep order."""
    try:
        return (
            not transport.TLS
            and transport.connected
            and not transport.disconnecting
            and not transport._writeDisconnected
            and transport.offset == len(transport.dataBuffer)
            and not transport._tempDataBuffer
        )
    except AttributeError:  # not Twisted's TCP transport: its own write decides
        return False


def _daphne_protocol(send: Any) -> Any | None:
    """daphne gives each connection ``functools.partial(server.handle_reply, protocol)`` as its ``send``."""
    if not isinstance(send, functools.partial) or len(send.args) != 1:
        return None
    protocol = send.args[0]
    needed = ("state", "STATE_OPEN", "send_state", "SEND_STATE_GROUND", "send_queue", "_perMessageCompress",
              "maskServerFrames", "transport")  # fmt: skip
    if type(protocol).__module__ != "daphne.ws_protocol" or not all(hasattr(protocol, name) for name in needed):
        return None
    return protocol


class ServerSendMiddleware:
    """ASGI, outermost: keeps the server's own ``send`` of a WebSocket in its scope, for ``SocketLane``."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            scope = {**scope, SCOPE_KEY: send}
        return await self.app(scope, receive, send)
