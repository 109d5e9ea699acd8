"""The agent's audio frames straight onto daphne's socket: one WebSocket frame header and one write each.

A call sends 12.5 binary audio frames a second, so one web process at 200 callers sends 2 500. Through the
ordinary path each went through channels' ``send`` (with the session middleware's wrapper), daphne's reply
routing (``Server.handle_reply`` -> ``WebSocketProtocol.handle_reply`` -> ``serverSend``) and autobahn's
``sendMessage`` -> ``sendFrame`` -> ``sendData``, which builds its debug-log arguments with debug logging off:
about a third of the loop's time on the agent's side of a call (bench/notes/serving-e2e.md). The bytes that
path writes for an audio frame are fixed by RFC 6455 (5.2): a final binary frame, unmasked from a server, its
payload length in 7, 16 or 64 bits, then the payload. This lane writes exactly those bytes to the socket's
transport itself.

It is used only while the connection is in the plain state where both paths write the same bytes: daphne's
autobahn protocol, open, no message half sent, nothing queued in autobahn (its queue keeps writes in order),
no per-message compression, server frames unmasked. Otherwise ``send_binary`` returns False and the frame
takes the ordinary path, so the closing handshake, a dropped connection (autobahn's ``Disconnected``) and
order with the text events (sent under the same lock) stay the frameworks'.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

SCOPE_KEY = "parley.server_send"  # the server's own ``send`` for this socket, put there by ServerSendMiddleware

_FINAL_BINARY = 0x82  # FIN + opcode 2


def frame_header(length: int) -> bytes:
    """The header of a final, unmasked binary frame with ``length`` payload bytes (RFC 6455 5.2)."""
    if length <= 125:
        return bytes((_FINAL_BINARY, length))
    if length <= 0xFFFF:
        return struct.pack("!BBH", _FINAL_BINARY, 126, length)
    return struct.pack("!BBQ", _FINAL_BINARY, 127, length)


class AudioLane:
    """Writes binary messages to one daphne WebSocket connection's transport (see the module's note)."""

    def __init__(self, protocol: Any):
        self.protocol = protocol

    @classmethod
    def for_scope(cls, scope: dict) -> AudioLane | None:
        """The lane for the socket of ``scope``, or None when the server is not daphne's autobahn protocol."""
        protocol = _daphne_protocol(scope.get(SCOPE_KEY))
        return cls(protocol) if protocol is not None else None

    def send_binary(self, payload: bytes) -> bool:
        """Write ``payload`` as one binary message; False (nothing written) when the ordinary path must send it."""
        p = self.protocol
        if (
            p.state != p.STATE_OPEN
            or p.send_state != p.SEND_STATE_GROUND
            or p.send_queue
            or p._perMessageCompress is not None
            or p.maskServerFrames
            or p.transport is None
        ):
            return False
        p.transport.write(frame_header(len(payload)) + payload)
        return True


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
    """ASGI, outermost: keeps the server's own ``send`` of a WebSocket in its scope, for ``AudioLane``."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            scope = {**scope, SCOPE_KEY: send}
        return await self.app(scope, receive, send)
