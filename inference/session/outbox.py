"""The bounded queue of events between a session and one connection (``Outbox``)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

from inference.contracts import AudioOut, SessionEvent, TextOut


class Outbox:
    """Events for one connection: control events are never dropped, audio beyond the bound drops the oldest.

    It also measures how long audio waits here for the connection to take it (the web tier's send
    path), which ``session.metrics`` reports as ``out_wait_ms_max``.
    """

    def __init__(self, max_audio: int):
        self.max_audio = max_audio
        self._items: deque[tuple[SessionEvent, float]] = deque()  # (event, monotonic time put)
        self._audio = 0
        self._ready = asyncio.Event()
        self.finished = False
        self.dropped_audio = 0
        self._max_wait_s = 0.0
        # Told when an event (or the end) is ready: a service link drains its sessions' outboxes together, once a
        # loop iteration, rather than one waiting task per session (inference/transport/service_link.py).
        self.on_ready: Callable[[], None] | None = None
        # Offered each event while nothing is queued; True: it was sent and is not queued (the web tier's outbound
        # lane, ``SessionHandle.send_events_directly``). Only while the queue is empty, so nothing is overtaken.
        self.direct: Callable[[SessionEvent], bool] | None = None

    def put(self, event: SessionEvent) -> None:
        if self.finished:
            return
        if not self._items and self.direct is not None and self.direct(event):
            return
        if isinstance(event, AudioOut):
            if self._audio >= self.max_audio:
                self._drop_oldest_audio()
            self._audio += 1
        self._items.append((event, time.monotonic()))
        self._ready.set()
        if self.on_ready is not None:
            self.on_ready()

    def drop_epoch_before(self, epoch: int) -> None:
        """Barge-in: forget audio and text of older epochs that were not sent yet."""
        kept = [item for item in self._items if not (isinstance(item[0], AudioOut | TextOut) and item[0].epoch < epoch)]
        self._items = deque(kept)
        self._audio = sum(isinstance(event, AudioOut) for event, _ in kept)

    def finish(self) -> None:
        self.finished = True
        self._ready.set()
        if self.on_ready is not None:
            self.on_ready()

    def take_max_wait_ms(self) -> float:
        """The longest wait of an audio event since the last call (ms)."""
        wait, self._max_wait_s = self._max_wait_s, 0.0
        return round(wait * 1000.0, 1)

    def __len__(self) -> int:
        return len(self._items)

    def stream(self) -> AsyncIterator[SessionEvent]:
        """Iterate the events; cancelling one ``__anext__`` (e.g. under ``wait_for``) loses nothing."""
        return self

    def __aiter__(self) -> Outbox:
        return self

    async def __anext__(self) -> SessionEvent:
        # A class, not an async generator: a generator cancelled at its await would be finished for good.
        while not self._items:
            if self.finished:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        return self._pop()

    def take(self) -> SessionEvent | None:
        """The next event without waiting; None when there is none (``finished`` says whether more can come)."""
        return self._pop() if self._items else None

    def _pop(self) -> SessionEvent:
        event, put_at = self._items.popleft()
        if isinstance(event, AudioOut):
            self._audio -= 1
            self._max_wait_s = max(self._max_wait_s, time.monotonic() - put_at)
        return event

    def _drop_oldest_audio(self) -> None:
        for i, (event, _) in enumerate(self._items):
            if isinstance(event, AudioOut):
                del self._items[i]
                self._audio -= 1
                self.dropped_audio += 1
                return
