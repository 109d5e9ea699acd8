"""How late this web process's event loop runs, and whether it may take another call.

One daphne process carries every one of its callers' sockets on one event loop, and in the embedded topology the
engine's worker and the recorder's writer share its interpreter too. When that loop saturates, every call in the
process is served late together: the callers' frames wait behind each other until the engine's framer drops them.
The engine's admission cannot see it (its tick keeps time), so the web process gates new calls on its own loop:

- a probe callback is scheduled every ``PROBE_PERIOD_S`` and timed against when it was due; its lateness is how
  long any message of this process waits for the loop just then;
- while the 90th percentile of the last ``WINDOW`` probes (5 s) is over the limit (``PARLEY_WEB_LOOP_LAG_MS``) the
  process is *busy*: new sessions are refused with ``resource_exhausted`` (close 4013), so the live calls keep
  the loop they have; it stays busy until the percentile falls to half the limit, so that the calls it then lets
  in do not push it straight back;
- the check comes before authentication (``LoopLoadMiddleware``): a refused connect costs the process its
  handshake and one error event, not the credential's database lookup, which at the limit, with callers retrying
  every few seconds, would be load of its own (8.7 ms of CPU a connect on the 2-core dev box, most of it that
  lookup); a client secret sent with it is not spent;
- a call takes a few seconds to cost what it will (session open, then audio), so calls admitted before the loop
  shows them would overshoot: while the percentile is past three quarters of the limit, at most one call is
  admitted every ``CAUTIOUS_ADMIT_S``. Not from half of it: at 100 callers on the 2-core dev box the percentile
  moves between 15 and 30 ms with no call late, and pacing there turned callers away in a soak.

The probe costs a timer callback every 50 ms. ``/ops/metrics`` shows the lateness (``parley_web_loop_late_ms``) and
the calls refused for it (``parley_admissions_refused_total{reason="web_process_busy"}``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

logger = logging.getLogger(__name__)

SCOPE_KEY = "parley.web_busy"  # why this connect is refused, set by LoopLoadMiddleware; the consumer says it
PROBE_PERIOD_S = 0.05
WINDOW = 100  # 5 s of probes: a stall of a few hundred ms (a collection, a burst of connects) is not a busy process
CAUTIOUS_FROM = 0.75  # of the limit: past it, one admission every CAUTIOUS_ADMIT_S
CAUTIOUS_ADMIT_S = 1.0


class LoopLoad:
    """The lateness of one event loop's probes, and the admission rule over it (see the module's note)."""

    def __init__(self, limit_ms: float, *, window: int = WINDOW, clock=time.monotonic):
        self.limit_ms = limit_ms
        self.clock = clock
        self.late_ms: collections.deque[float] = collections.deque(maxlen=window)
        self.busy = False
        self.refused = 0
        self._last_admitted = float("-inf")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = 0.0

    # ---- the probe --------------------------------------------------------------------------------

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start probing ``loop`` (once; a later call for the same loop does nothing)."""
        if self._loop is loop:
            return
        self._loop = loop
        self.late_ms.clear()
        self._due = loop.time() + PROBE_PERIOD_S
        loop.call_at(self._due, self._probe, loop)

    def stop(self) -> None:
        """Stop probing (its next probe does not schedule another)."""
        self._loop = None

    def _probe(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return  # stopped, or a newer loop is watched (tests start one per case)
        now = loop.time()
        self.observe((now - self._due) * 1000.0)
        self._due = now + PROBE_PERIOD_S
        loop.call_at(self._due, self._probe, loop)

    def observe(self, late_ms: float) -> None:
        """One probe's lateness; the busy state follows the window's 90th percentile."""
        self.late_ms.append(max(0.0, late_ms))
        p90, was_busy = self.p90_ms(), self.busy
        if p90 > self.limit_ms:
            self.busy = True
        elif p90 <= self.limit_ms / 2:
            self.busy = False
        if self.busy != was_busy:  # an operator sees when and how often the process turned calls away
            logger.warning(
                "web.loop_busy" if self.busy else "web.loop_caught_up",
                extra={"loop_late_p90_ms": round(p90, 1), "refused": self.refused},
            )

    def p90_ms(self) -> float:
        if not self.late_ms:
            return 0.0
        ordered = sorted(self.late_ms)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]

    # ---- admission ---------------------------------------------------------------------------------

    def admits(self) -> bool:
        """Whether a new call may start now; a True counts as that call admitted."""
        if self.limit_ms <= 0:
            return True
        now = self.clock()
        cautious = self.p90_ms() > self.limit_ms * CAUTIOUS_FROM
        if self.busy or (cautious and now - self._last_admitted < CAUTIOUS_ADMIT_S):
            self.refused += 1
            return False
        self._last_admitted = now
        return True

    def refusal_message(self) -> str:
        late = f"its event loop runs {self.p90_ms():.0f} ms late against a limit of {self.limit_ms:g} ms"
        if self.busy:
            return f"This server is at the load it can carry without making its calls late ({late}); try again later."
        return (
            f"This server is near the load it can carry ({late}) and lets one new call in a second; "
            f"try again in a few seconds."
        )


_load: LoopLoad | None = None


def process_load() -> LoopLoad:
    """This process's ``LoopLoad`` (limit from ``PARLEY_WEB_LOOP_LAG_MS``), probing the running loop."""
    global _load
    from django.conf import settings

    limit = float(settings.PARLEY_WEB_LOOP_LAG_MS)
    if _load is None or _load.limit_ms != limit:
        if _load is not None:
            _load.stop()
        _load = LoopLoad(limit)
    if limit > 0:
        _load.watch(asyncio.get_running_loop())
    return _load


def current() -> LoopLoad | None:
    """This process's ``LoopLoad`` once a call has asked for it (the metrics read it), else None."""
    return _load


class LoopLoadMiddleware:
    """ASGI: a WebSocket connect to one of ``paths`` while this process is busy goes straight to ``busy_app`` with
    the reason in ``scope[SCOPE_KEY]`` (no authentication, no database); everything else goes to ``app``.
    Other sockets (the operations console's) are never turned away: an overloaded process is when it is needed."""

    def __init__(self, app, *, busy_app, paths: tuple[str, ...]):
        self.app, self.busy_app, self.paths = app, busy_app, paths

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and scope.get("path") in self.paths:
            load = process_load()
            if not load.admits():
                return await self.busy_app({**scope, SCOPE_KEY: load.refusal_message()}, receive, send)
        return await self.app(scope, receive, send)
