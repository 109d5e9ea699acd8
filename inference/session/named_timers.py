"""One-shot event-loop timers kept by name, so that a session can restart or cancel each of its timers.

A session runs a handful (grace, pause, max_duration, the metrics tick); starting one again replaces it,
and closing the session cancels them all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class NamedTimers:
    """``loop.call_later`` handles by name, on one loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._handles: dict[str, asyncio.TimerHandle] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._handles

    def start(self, name: str, delay_s: float, callback: Callable[..., object], *args: object) -> None:
        """Call ``callback(*args)`` in ``delay_s`` seconds, replacing the timer of that name."""
        self.cancel(name)
        self._handles[name] = self._loop.call_later(delay_s, callback, *args)

    def cancel(self, name: str) -> None:
        """Cancel the timer (or forget one that already fired); nothing if there is none."""
        handle = self._handles.pop(name, None)
        if handle is not None:
            handle.cancel()

    def cancel_all(self) -> None:
        for name in list(self._handles):
            self.cancel(name)
