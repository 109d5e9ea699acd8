"""Helpers for the inference service tests: read a handle's events with timeouts, make marked frames."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from inference.contracts import AudioOut, Metrics, SessionEvent, TextOut

FRAME = 1920  # 80 ms at 24 kHz


class EventReader:
    """Reads one handle's events with timeouts, skipping the periodic noise on request."""

    def __init__(self, handle):
        self.handle = handle
        self._events: AsyncIterator[SessionEvent] = handle.events()
        self.seen: list[SessionEvent] = []

    async def next(self, within_s: float = 3.0, *, skip_media: bool = True) -> SessionEvent:
        while True:
            event = await asyncio.wait_for(anext(self._events), within_s)
            self.seen.append(event)
            if skip_media and isinstance(event, AudioOut | TextOut | Metrics):
                continue
            return event

    async def until(self, kind: type, within_s: float = 3.0) -> SessionEvent:
        """The next event of type ``kind``, whatever comes before it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while True:
            event = await self.next(max(0.01, deadline - loop.time()), skip_media=False)
            if isinstance(event, kind):
                return event

    async def ended(self, within_s: float = 3.0) -> bool:
        """True once the stream has finished (after Closed or Replaced)."""
        try:
            while True:
                self.seen.append(await asyncio.wait_for(anext(self._events), within_s))
        except StopAsyncIteration:
            return True


def pcm16_frame(marker: int, samples: int = FRAME) -> bytes:
    """A pcm16 frame whose samples all equal ``marker``, so an echo can be recognised exactly."""
    return np.full(samples, marker, dtype="<i2").tobytes()


async def send_frames(handle, markers, *, period_s: float = 0.08) -> None:
    for marker in markers:
        await handle.append_audio(pcm16_frame(marker), encoding="pcm16", rate=24000)
        await asyncio.sleep(period_s)
