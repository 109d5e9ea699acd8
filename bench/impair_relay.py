"""User-space network impairment: a UDP relay and a TCP relay that delay and drop (no netem on this kernel).

Both directions are impaired alike and independently. Each packet (UDP datagram, or TCP read) is held for
``delay_ms`` +/- ``jitter_ms`` (uniform), first in first out: a packet never overtakes an earlier one (a
queue's jitter, as on an access link; per-packet reordering would be a different and rarer network). A lost
UDP datagram is gone. TCP cannot lose a byte: a "lost" segment is delivered after the retransmission a
sender would make, ``2 x RTT`` later (Linux's tail-loss probe fires after two smoothed round trips, and an
audio stream is too thin for three duplicate ACKs to come sooner), and everything behind it waits (head-of-
line blocking). That is what loss does to a WebSocket.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Impairment:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0  # probability per packet and direction
    seed: int = 0

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)

    def hold_s(self) -> float:
        return max(0.0, self.delay_ms + self.random.uniform(-self.jitter_ms, self.jitter_ms)) / 1000

    def lost(self) -> bool:
        return self.loss > 0 and self.random.random() < self.loss

    @property
    def retransmit_s(self) -> float:
        return 2 * (2 * self.delay_ms) / 1000  # 2 x RTT


@dataclass
class Counts:
    packets: dict = field(default_factory=lambda: {"up": 0, "down": 0})
    lost: dict = field(default_factory=lambda: {"up": 0, "down": 0})


class _Lane:
    """One direction: FIFO delivery at max(previous delivery, now + hold).

    Packets wait in the lane's own queue and each timer delivers every packet due, oldest first: packets due at
    the same instant (a packet held less than the one before it is due with it) would otherwise go in the
    event loop's timer order, which for equal times is not the order they came in. For TCP that reordered a
    connection's last data behind its end: the close frame was lost and the browser saw code 1006.
    """

    def __init__(self, impairment: Impairment, counts: Counts, direction: str, deliver) -> None:
        self.impairment, self.counts, self.direction, self.deliver = impairment, counts, direction, deliver
        self.last_due = 0.0
        self.queue: deque[tuple[float, bytes]] = deque()
        self.loop = asyncio.get_running_loop()

    def push(self, data: bytes, *, reliable: bool) -> None:
        self.counts.packets[self.direction] += 1
        due = time.monotonic() + self.impairment.hold_s()
        if self.impairment.lost():
            self.counts.lost[self.direction] += 1
            if not reliable:
                return
            due += self.impairment.retransmit_s
        due = max(due, self.last_due)
        self.last_due = due
        self.queue.append((due, data))
        self.loop.call_later(max(0.0, due - time.monotonic()), self._deliver_due)

    def _deliver_due(self) -> None:
        now = time.monotonic() + 0.001  # a timer may fire a hair early; its own packet must not stay behind
        while self.queue and self.queue[0][0] <= now:
            self.deliver(self.queue.popleft()[1])


class UdpRelay:
    """Client <-> front port | relay | back port <-> ``upstream`` (the server's ICE candidate), one client at a
    time: each side is told only the relay's port facing it as the other's candidate (``front_port`` for the
    client, ``back_port`` for the server), so ICE has no other path. ``client`` is where the back port's
    traffic goes until the client has been heard from (the client's own candidate)."""

    def __init__(self, impairment: Impairment) -> None:
        self.impairment = impairment
        self.counts = Counts()
        self.client_addr = None
        self.client = None
        self.upstream = None
        self.front = self.back = None

    async def start(self, host: str) -> int:
        loop = asyncio.get_running_loop()
        relay = self

        class Front(asyncio.DatagramProtocol):
            def datagram_received(self, data, addr):
                relay.client_addr = addr
                relay.up.push(data, reliable=False)

        class Back(asyncio.DatagramProtocol):
            def datagram_received(self, data, addr):
                relay.down.push(data, reliable=False)

        self.front, _ = await loop.create_datagram_endpoint(Front, local_addr=(host, 0))
        self.back, _ = await loop.create_datagram_endpoint(Back, local_addr=(host, 0))
        self.up = _Lane(self.impairment, self.counts, "up", self._to_server)
        self.down = _Lane(self.impairment, self.counts, "down", lambda d: self._to_client(d))
        return self.front.get_extra_info("sockname")[1], self.back.get_extra_info("sockname")[1]

    def _to_client(self, data: bytes) -> None:
        if (where := self.client_addr or self.client) is not None and not self.front.is_closing():
            self.front.sendto(data, where)

    def _to_server(self, data: bytes) -> None:
        if self.upstream is not None and not self.back.is_closing():
            self.back.sendto(data, self.upstream)

    def close(self) -> None:
        for transport in (self.front, self.back):
            if transport is not None:
                transport.close()


class TcpRelay:
    """Relay port -> ``upstream`` (host, port) for every connection, each read a segment."""

    def __init__(self, impairment: Impairment, upstream: tuple[str, int]) -> None:
        self.impairment, self.upstream = impairment, upstream
        self.counts = Counts()
        self.server = None

    async def start(self, host: str = "127.0.0.1") -> int:
        self.server = await asyncio.start_server(self._connection, host, 0)
        return self.server.sockets[0].getsockname()[1]

    async def _connection(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        up = _Lane(self.impairment, self.counts, "up", lambda d: server_writer.write(d) if d else server_writer.close())
        down = _Lane(
            self.impairment, self.counts, "down", lambda d: client_writer.write(d) if d else client_writer.close()
        )
        await asyncio.gather(self._pump(client_reader, up), self._pump(server_reader, down), return_exceptions=True)

    @staticmethod
    async def _pump(reader, lane: _Lane) -> None:
        while data := await reader.read(65536):
            lane.push(data, reliable=True)
        lane.push(b"", reliable=True)  # the end, in order

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
