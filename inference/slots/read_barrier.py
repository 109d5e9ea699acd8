"""Before a tick takes its inputs: let the sessions' event loops read what reached their sockets before the tick.

A caller's frame that reaches the socket a few milliseconds before a tick makes that tick only if the event loop
has read it and pushed it into the slot's inbox when the worker takes its inputs. A loop that is busy at that
moment (the previous tick's deliveries, other callers' frames, the worker and the recorder holding the
interpreter) reads it after, and the frame goes with the next tick: 80 ms more for a frame that was in time. On
the 2-core machine at 200 echo callers that was a fifth to a half of the frames (bench/notes/serving-e2e.md,
"The tick's read barrier").

So at each tick the worker posts a marker to every loop that owns a stepped slot and waits, up to a bound, for
the marker to come back. The marker is two steps: ``call_soon_threadsafe`` puts the first among the callbacks
ready now; it schedules the second with ``call_soon``, which asyncio runs only after its next poll of the sockets
and the reads that poll found. So when the second runs, every byte that was readable when the tick began has
been read and its frame pushed (for a selector loop; the bound keeps any other to a short wait). The worker waits
without the interpreter, which is what a loop held up by the worker's own tick needs; the wait counts against
the tick's deadline, not its time (admission reads the time).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable


class ReadBarrier:
    """One tick's wait for its loops' reads; the worker thread's own, reused every tick."""

    def __init__(self, wait_s: float):
        self.wait_s = wait_s
        self._done = threading.Event()
        self._pending = 0
        self._generation = 0  # a marker of a tick that gave up at the bound counts for no later tick
        self._lock = threading.Lock()
        self.waits = 0  # ticks that waited, and of them those that gave up at the bound
        self.timeouts = 0

    def wait(self, loops: Iterable[asyncio.AbstractEventLoop]) -> float:
        """Post the marker to each loop and wait up to ``wait_s`` for all of them; returns the seconds waited."""
        if self.wait_s <= 0:
            return 0.0
        started = time.perf_counter()
        self._done.clear()
        posted = 0
        with self._lock:
            self._generation += 1
            self._pending = 0
            for loop in set(loops):
                try:
                    loop.call_soon_threadsafe(self._first, loop, self._generation)
                except RuntimeError:  # a closed loop reads nothing more
                    continue
                self._pending += 1
                posted += 1
        if not posted:
            return 0.0
        self.waits += 1
        if not self._done.wait(self.wait_s):
            self.timeouts += 1
        return time.perf_counter() - started

    def _first(self, loop: asyncio.AbstractEventLoop, generation: int) -> None:
        loop.call_soon(self._second, generation)  # after the next poll and the reads it found

    def _second(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return
            self._pending -= 1
            if self._pending == 0:
                self._done.set()
