"""``FrameBatch``: a link's outgoing frames, written together once a loop iteration.

A link carries every session of a web process (``inference.transport.link``), so what one loop iteration
produces for many sessions (a tick's audio for all of them, a burst of callers' frames) leaves in one write,
one system call, rather than one per frame and session.
"""

from __future__ import annotations

import asyncio

# A tick's audio for a few hundred sessions is ~1 MB on one link: a write buffer of asyncio's default 64 KiB would
# report congestion on every tick. Past this, the link waits for its peer before it takes more.
HIGH_WATER_BYTES = 8 * 1024 * 1024


class FrameBatch:
    """Frames for one connection, flushed by the loop once the current callback is done."""

    def __init__(self, writer: asyncio.StreamWriter):
        self._writer = writer
        self._parts: list[bytes] = []
        self._pending = 0
        writer.transport.set_write_buffer_limits(high=HIGH_WATER_BYTES)

    def write(self, *parts: bytes) -> None:
        if not self._parts:
            asyncio.get_running_loop().call_soon(self.flush)
        self._parts.extend(parts)
        self._pending += sum(map(len, parts))

    def flush(self) -> None:
        if not self._parts:
            return
        parts, self._parts, self._pending = self._parts, [], 0
        if not self._writer.is_closing():
            self._writer.writelines(parts)

    @property
    def congested(self) -> bool:
        """More waits to go out than the peer has taken: stop producing until ``drain``."""
        return self._pending + self._writer.transport.get_write_buffer_size() >= HIGH_WATER_BYTES

    async def drain(self) -> None:
        """Wait while the peer is behind (at once otherwise); raises ConnectionError once the connection is lost."""
        if self.congested:
            self.flush()
        await self._writer.drain()
