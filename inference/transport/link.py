"""``Link``: this web process's one connection to an inference service; its sessions ride it as channels.

Each ``RemoteSessionHandle`` (``inference.transport.client``) takes a channel on the link to its service's
address, opened on first use and shared by every call of the process on that event loop. One reader task hands
the link's frames to their channels; what the process writes in one loop iteration leaves in one write
(``FrameBatch``). When the connection is lost, every session on it learns so at once, as a caller's own
connection did; the next call dials anew. The service's side is ``inference.transport.service_link``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import weakref
from typing import Protocol

from inference.errors import WireError
from inference.transport import wire
from inference.transport.dial import connect, read_reply
from inference.transport.frame_batch import FrameBatch


class Channel(Protocol):
    """What a link hands its frames to (``RemoteSessionHandle``)."""

    def on_frame(self, kind: int, payload: bytes) -> None: ...

    def on_link_lost(self) -> None: ...


# Per event loop (daphne has one; tests have one per test), the links by address.
_links: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Future[Link]]] = (
    weakref.WeakKeyDictionary()
)


class Link:
    """One connection that has passed the handshake and answered ``link``."""

    def __init__(self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.address = address
        self._reader, self._writer = reader, writer
        self.out = FrameBatch(writer)
        self.channels: dict[int, Channel] = {}
        self._ids = itertools.count(1)
        self.lost = False
        self._reader_task = asyncio.create_task(self._read_loop())

    @classmethod
    async def to(cls, address: str) -> Link:
        """This loop's link to ``address``: the open one, or a new one (dialled once, however many ask at once)."""
        links = _links.setdefault(asyncio.get_running_loop(), {})
        pending = links.get(address)
        if pending is not None and not (pending.done() and (pending.exception() or pending.result().lost)):
            return await asyncio.shield(pending)
        dialling: asyncio.Future[Link] = asyncio.get_running_loop().create_future()
        links[address] = dialling
        try:
            link = await _dial(address)
        except BaseException as exc:
            links.pop(address, None)
            dialling.set_exception(exc)
            dialling.exception()  # retrieved: a dial nobody else waited for is not an unhandled error
            raise
        dialling.set_result(link)
        return link

    def attach(self, channel: Channel) -> int:
        number = next(self._ids)
        self.channels[number] = channel
        return number

    def forget(self, number: int) -> None:
        self.channels.pop(number, None)

    def send(self, number: int, frame: bytes) -> None:
        """Queue ``frame`` on channel ``number``; it leaves with the rest of this loop iteration's frames."""
        self.out.write(wire.channel_header(number, frame), frame)

    @property
    def behind(self) -> bool:
        """``drain`` would wait or raise: the service is behind, or the link is lost."""
        return self.lost or self.out.congested

    async def drain(self) -> None:
        """Wait while the service is behind; ConnectionError once the link is lost."""
        if self.lost:
            raise ConnectionResetError("the link to the inference service is lost")
        await self.out.drain()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task

    async def _read_loop(self) -> None:
        try:
            while (item := await wire.read_frame(self._reader)) is not None:
                kind, payload = item
                if kind != wire.CHANNEL:
                    raise WireError(f"a link carries channel frames, not kind {kind}")
                number, inner_kind, inner = wire.split_channel(payload)
                channel = self.channels.get(number)
                if channel is not None:  # else a channel this process let go of: its last frames go nowhere
                    channel.on_frame(inner_kind, inner)
        except (WireError, ConnectionError):
            pass
        finally:
            self.lost = True
            links = _links.get(asyncio.get_running_loop(), {})
            if (pending := links.get(self.address)) is not None and pending.done() and pending.result() is self:
                del links[self.address]
            channels, self.channels = self.channels, {}
            for channel in channels.values():
                channel.on_link_lost()
            self._writer.close()


async def close_links() -> None:
    """Close this loop's links (the facade's shutdown): their sessions are detached, as a dropped connection's."""
    links = _links.pop(asyncio.get_running_loop(), {})
    for pending in links.values():
        if pending.done() and not pending.exception():
            await pending.result().close()


async def _dial(address: str) -> Link:
    reader, writer = await connect(address)
    try:
        writer.write(wire.json_frame({"op": "link"}))
        await writer.drain()
        await read_reply(reader)
    except BaseException:
        writer.close()
        raise
    return Link(address, reader, writer)
