"""How a realtime socket's server events leave: in order, by the socket lane where it can, else the frameworks.

``ServerEventSending`` is the sending half of ``RealtimeConsumer`` (``consumers``): the one translation of errors
into ``error`` events (``_reject``), the ordered send under the socket's lock (``_emit``), and the close. The
consumer sets what it reads: ``send_lock``, ``sending`` (counted for the outbound lane), ``socket_closed``,
``lane`` and ``events``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from autobahn.exception import Disconnected  # daphne's WebSocket protocol: a send after the peer went away

from webapp.conversations import protocol as p
from webapp.conversations.outbound_lane import wire_message
from webapp.conversations.server_events import Outgoing, RealtimeEvents
from webapp.conversations.socket_lane import SocketLane
from webapp.operations.metrics import MESSAGES_SENT

if TYPE_CHECKING:
    from inference.contracts import ParleyError


class ServerEventSending:
    """Mixed into the consumer, before channels' ``AsyncWebsocketConsumer`` (whose ``send`` and ``close`` it uses)."""

    send_lock: asyncio.Lock
    sending: int
    socket_closed: bool
    lane: SocketLane | None
    events: RealtimeEvents

    async def _reject(self, exc: p.ProtocolError | ParleyError, event_id: str | None = None) -> None:
        """The one translation of rejected input and facade errors into an ``error`` event."""
        client_event_id = getattr(exc, "event_id", None) or event_id
        await self._emit(
            [
                self.events.error(
                    exc.code, exc.message, error_type=exc.error_type, param=exc.param, client_event_id=client_event_id
                )
            ]
        )

    async def _emit(self, outgoing: list[Outgoing]) -> None:
        # Build-then-emit has no await in between, and the lock is FIFO: sequence numbers go out in order. The
        # outbound lane sends nothing while ``sending``: the lock's waiters hold server events stamped earlier.
        self.sending += 1
        try:
            async with self.send_lock:
                await self._send_in_order(outgoing)
        finally:
            self.sending -= 1

    async def _send_in_order(self, outgoing: list[Outgoing]) -> None:
        for item in outgoing:
            if self.socket_closed:
                return
            message = wire_message(item)
            if self.lane is not None and self.lane.send(message):
                MESSAGES_SENT["lane"] += 1
                continue
            MESSAGES_SENT["framework"] += 1
            try:
                if isinstance(message, bytes):
                    await self.send(bytes_data=message)
                else:
                    await self.send(text_data=message)
            except Disconnected:
                # The client dropped the TCP connection (pipecat does on any error event) and daphne has
                # not yet delivered websocket.disconnect: nothing more can be sent; disconnect() follows.
                self.socket_closed = True
                return

    async def _close(self, code: int) -> None:
        if not self.socket_closed:
            self.socket_closed = True
            await self.close(code=code)
