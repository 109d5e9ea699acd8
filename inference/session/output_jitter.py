"""Test-only network jitter on a session's outgoing audio (``PARLEY_TEST_OUTPUT_JITTER_MS``).

Bad networks must degrade a call, never break it; to show that on loopback, the service can hold each
tick's output back by a random 0..``max_ms`` before handing it to the connection. Order is kept, as a
TCP connection keeps it: an output that would overtake the one before waits for it, so a long delay
followed by short ones arrives as a burst. Jitter applies during the first ``first_s`` seconds of a
session's output (0 = always), so a benchmark also sees the latency come back down after it stops.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable


class OutputJitter:
    """Releases callbacks on ``loop`` after random delays, in the order they were held.

    Args:
        loop: the session's event loop.
        max_ms: each held output waits uniformly 0..max_ms (plus whatever it waits behind).
        first_s: only outputs within this many seconds of the first one are delayed (0 = all).
        seed: for a reproducible pattern.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, max_ms: float, first_s: float = 0.0, seed: int | None = None):
        if max_ms <= 0 or first_s < 0:
            raise ValueError("max_ms must be > 0 and first_s >= 0")
        self.loop = loop
        self.max_s = max_ms / 1000.0
        self.first_s = first_s
        self._rng = random.Random(seed)
        self._held: deque[tuple[float, Callable[[], None]]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._started: float | None = None
        self._last_release = 0.0

    def send(self, deliver: Callable[[], None]) -> None:
        """Run ``deliver`` after this output's delay (at once when the jitter phase is over and nothing is held)."""
        now = self.loop.time()
        if self._started is None:
            self._started = now
        jittering = self.first_s == 0 or now - self._started < self.first_s
        if not jittering and not self._held:
            deliver()
            return
        delay = self._rng.uniform(0.0, self.max_s) if jittering else 0.0
        release = max(now + delay, self._last_release)
        self._last_release = release
        self._held.append((release, deliver))
        self._arm()

    def cancel(self) -> None:
        """Drop everything held (the session closed)."""
        self._held.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if self._timer is None and self._held:
            self._timer = self.loop.call_at(self._held[0][0], self._release_due)

    def _release_due(self) -> None:
        self._timer = None
        now = self.loop.time()
        while self._held and self._held[0][0] <= now:
            self._held.popleft()[1]()
        self._arm()
