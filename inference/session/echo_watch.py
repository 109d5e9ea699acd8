"""Live echo watch: every few seconds, whether the caller's microphone picks up what their speakers play.

The session hands over the caller's audio as it is pushed to the engine and the agent's audio as it is sent to
the connection (a copy into an int16 ring buffer each, the caller's scaled on the way: no other work per frame).
The page's playback acks name one instant twice: where the agent's audio it had just finished playing ends among
the connection's output samples, and where its microphone stream stood at that instant (``playback.ack``'s
``output_samples`` and ``input_samples``, docs/protocol.md). Between acks the two positions are interpolated,
which lines up what the caller heard with what their microphone took in, at the sample, whatever the network and
the jitter buffer added. Each ``WINDOW_S`` window is measured with the recordings' maths
(``inference.audio.echo_leak.find_echo``) once every ``PERIOD_S``: the session's once-a-second housekeeping
copies the window out, one thread of the process measures it, and the next housekeeping reports it; nothing of
it is on the per-frame path (bench/echo_watch_cost.py measures both).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from inference.audio.echo_leak import AGENT_SILENT, ANALYSIS_RATE, MIN_AGENT_RMS, find_echo, to_analysis_rate

WINDOW_S = 4.0  # long enough for a -30 dB echo to stand out of chance peaks (echo_leak.MIN_PEAK_SIGMAS)
PERIOD_S = 5.0  # one window a call every 5 s: the warning comes within about 5-10 s of the leak starting
# After 3 clean windows in a row (windows with the agent speaking) the period doubles up to MAX_PERIOD_S; a
# flagged window brings it back to 5 s.
# A window costs ~13 ms of CPU, 0.68 core at 200 calls every 5 s (bench/echo_watch_cost.py): on a web process
# that carries the callers' frames that is most of a core. A leak that starts mid-call (headphones taken off)
# is then found within MAX_PERIOD_S plus a window; one present from the start within the first 15 s.
MAX_PERIOD_S = 30.0
STEADY_AFTER_S = 60.0  # the first minute of a connection is watched every 5 s whatever the windows say
# The agent's audio is heard up to the jitter buffer's depth (plus the network) after it was sent, and a window
# is measured up to about 1.5 s after its last instant: 4 s of slack. Both rings hold int16, 8 s at 24 kHz: 768 KB
# a session. The caller's is scaled by 32767 (to_analysis_rate reads int16 as k / 32768: 0.0003 dB off); float16
# took as much memory, and its conversion cost 4.5 us a frame on the event loop against 1.8 (2-core dev box).
KEEP_S = WINDOW_S + 4.0
QUIET = AGENT_SILENT | {"window_s": WINDOW_S}
MAX_ACKS = 256  # at least a window and a half of instants, two a chunk where playback stopped between chunks
# The process's echo thread spends at most this share of a core, averaged over BUDGET_SPAN_S; a window that comes
# due while it is spent waits another PERIOD_S (counted in ``deferred``). The watch shares the process with the
# callers' frames (a web process) or the engine's tick loop (a service): at 200 calls in their first minute it
# wants ~0.5 core, which on a 2-core host took the frames' CPU (bench/notes/serving-e2e.md). 0.15 core keeps
# every call watched every 5 s up to ~55 calls, and 229 calls in their steady state (30 s between clean windows).
CORES_ENV = "PARLEY_ECHO_WATCH_CORES"
DEFAULT_CORES = 0.15
BUDGET_SPAN_S = 10.0

logger = logging.getLogger(__name__)


class _Ring:
    """The latest ``capacity`` samples of a stream, addressed by absolute position."""

    def __init__(self, capacity: int, dtype: Any):
        self.buffer = np.zeros(capacity, dtype)
        self.end = 0  # absolute position after the newest sample

    def append(self, samples: np.ndarray) -> None:
        n, capacity = len(samples), len(self.buffer)
        if n >= capacity:
            self.buffer[:] = samples[-capacity:]
            self.buffer = np.roll(self.buffer, self.end + n)  # keep position p at index p % capacity
        else:
            start = self.end % capacity
            first = min(n, capacity - start)
            self.buffer[start : start + first] = samples[:first]
            self.buffer[: n - first] = samples[first:]
        self.end += n

    def read(self, start: int, stop: int) -> np.ndarray | None:
        """Samples ``start:stop``, or None when part of them is not held (too old, or not there yet)."""
        capacity = len(self.buffer)
        if start < max(0, self.end - capacity) or stop > self.end or stop <= start:
            return None
        first, last = start % capacity, (stop - 1) % capacity + 1
        if first < last:
            return self.buffer[first:last].copy()
        return np.concatenate((self.buffer[first:], self.buffer[:last]))


class EchoWatch:
    """One session's echo measurement over its current connection.

    Args:
        input_rate: the engine's input rate (the caller's audio as pushed).
        output_rate: the engine's output rate (the agent's audio as sent).
    """

    def __init__(self, input_rate: int, output_rate: int):
        self.input_rate, self.output_rate = input_rate, output_rate
        self.cost_s = 0.0  # time spent measuring, for the bench (bench/echo_watch_cost.py)
        self.windows = 0
        self.deferred = 0  # windows put off because the process's echo budget was spent
        self.attached()

    def attached(self) -> None:
        """A new connection: its positions (and the page's acks) count from zero."""
        self._caller = _Ring(int(KEEP_S * self.input_rate), np.int16)
        self._agent = _Ring(int(KEEP_S * self.output_rate), np.int16)
        self._acks: list[tuple[float, float]] = []  # (caller position, agent position), engine rates
        self._measured_until = 0.0
        self._next_at = time.monotonic() + PERIOD_S
        self._pending: Future | None = None  # a window being measured on the echo thread
        self._clean_streak = 0  # windows in a row with no echo: the period backs off after 3
        self._attached_at = time.monotonic()

    def caller(self, samples: np.ndarray) -> None:
        # samples are in [-1, 1] (InputAudio's contract), so the int16 ring's cast cannot wrap
        self._caller.append(samples * 32767.0)

    def agent(self, pcm16: bytes) -> None:
        self._agent.append(np.frombuffer(pcm16, "<i2"))

    def ack(self, *, input_samples: int, client_rate: int, output_samples: int) -> None:
        """The page had played the agent's audio up to ``output_samples`` when its microphone stream stood at
        ``input_samples`` (in the client's rate)."""
        at = input_samples * self.input_rate / client_rate
        if self._acks and (at <= self._acks[-1][0] or output_samples < self._acks[-1][1]):
            return  # out of order, or from before a flush the page has not caught up with: skip it
        self._acks.append((at, float(output_samples)))
        del self._acks[:-MAX_ACKS]

    def measure_if_due(self, *, inline: bool = False) -> dict[str, Any] | None:
        """The latest finished window's ``find_echo`` result (with ``window_s``), or None.

        When a window is due and the acks cover it, its audio is copied out here and the maths runs on the
        process's one echo thread (``inline``: here, for tests and the bench), so the event loop is held for a
        copy, not an FFT; the result comes with a later call (the next second's housekeeping).
        """
        finished = None
        if self._pending is not None and self._pending.done():
            finished, self._pending = self._counted(self._pending.result()), None
        now = time.monotonic()
        if self._pending is None and now >= self._next_at and len(self._acks) >= 2:
            if not inline and not budget().admits():
                self._next_at = now + PERIOD_S
                self.deferred += 1
                return finished
            window = self._latest_window()
            if window is not None:
                self._next_at = now + self.period_s()
                self.windows += 1
                if inline:
                    return self._counted(self._timed(window))
                self._pending = _executor().submit(self._timed, window)
        return finished

    def period_s(self) -> float:
        """The time to the next window: ``PERIOD_S`` in a connection's first minute (a speakerphone is most often
        there from the start, and the first windows may not see it yet), then doubled per clean window past
        the third, at most ``MAX_PERIOD_S``."""
        if time.monotonic() - self._attached_at < STEADY_AFTER_S:
            return PERIOD_S
        return min(PERIOD_S * 2 ** max(0, self._clean_streak - 2), MAX_PERIOD_S)

    def _counted(self, result: dict[str, Any]) -> dict[str, Any]:
        # Only windows in which the agent spoke say anything about an echo: a silent one keeps the streak as is,
        # so a call that starts quietly is still watched every 5 s once the agent talks.
        if not result.get("agent_silent"):
            self._clean_streak = 0 if result.get("flagged") else self._clean_streak + 1
        return result

    def _timed(self, window: tuple[Any, ...]) -> dict[str, Any]:
        started = time.thread_time()
        try:
            return _measure(*window)
        finally:
            cost = time.thread_time() - started
            self.cost_s += cost
            budget().spend(cost)

    def _latest_window(self) -> tuple[Any, ...] | None:
        """What one window's measurement needs, copied: (mic, agent, where the agent stood at each instant, ...)."""
        stop = int(self._acks[-1][0])
        start = stop - int(WINDOW_S * self.input_rate)
        if start < self._acks[0][0] or start < self._measured_until:
            return None
        mic = self._caller.read(start, stop)
        if mic is None:
            return None
        acks = np.asarray(self._acks)
        # The instants of the window at the analysis rate, and where the agent's audio stood at each.
        instants = start + np.arange(int(WINDOW_S * ANALYSIS_RATE)) * (self.input_rate / ANALYSIS_RATE)
        heard_at = np.interp(instants, acks[:, 0], acks[:, 1])
        first, last = int(heard_at[0]), int(np.ceil(heard_at[-1])) + 1
        agent = self._agent.read(first, last)
        if agent is None:
            return None
        self._measured_until = stop
        return mic, self.input_rate, agent, self.output_rate, heard_at - first


def _measure(mic: np.ndarray, mic_rate: int, agent: np.ndarray, agent_rate: int, heard_at: np.ndarray) -> dict:
    """One window: the agent's audio as heard at each analysis instant (``heard_at``: positions in ``agent``)
    against the microphone."""
    if np.sqrt(np.mean(np.square(agent, dtype=np.float64))) < MIN_AGENT_RMS * 32768:
        return QUIET  # the agent was silent: it cannot have leaked, and nothing is worth computing
    agent_8k = to_analysis_rate(agent, agent_rate)
    heard = np.interp(heard_at * (ANALYSIS_RATE / agent_rate), np.arange(len(agent_8k)), agent_8k)
    return find_echo(heard=heard, mic=to_analysis_rate(mic, mic_rate)) | {"window_s": WINDOW_S}


class EchoBudget:
    """The CPU the process's echo windows may take: ``cores`` of a core over the last ``span_s`` seconds.

    Under load the watch is what gives way (windows come less often), not the callers' frames or the tick.
    """

    def __init__(self, cores: float, span_s: float = BUDGET_SPAN_S, clock=time.monotonic):
        self.cores, self.span_s, self._clock = cores, span_s, clock
        self._spent: deque[tuple[float, float]] = deque()  # (when, CPU seconds) of the windows measured
        self._lock = threading.Lock()  # spent on the echo thread, read on the event loop
        self.limited = False

    def spend(self, cpu_s: float) -> None:
        with self._lock:
            self._spent.append((self._clock(), cpu_s))

    def admits(self) -> bool:
        """Whether another window may be measured now."""
        if self.cores <= 0:
            return False
        with self._lock:
            horizon = self._clock() - self.span_s
            while self._spent and self._spent[0][0] < horizon:
                self._spent.popleft()
            used = sum(cost for _, cost in self._spent) / self.span_s
        over = used >= self.cores
        if over != self.limited:
            self.limited = over
            (logger.warning if over else logger.info)(
                "echo_watch.budget_spent" if over else "echo_watch.budget_ok",
                extra={"cores_used": round(used, 3), "cores_allowed": self.cores},
            )
        return not over


@functools.cache
def budget() -> EchoBudget:
    """The process's echo budget (``PARLEY_ECHO_WATCH_CORES``, default ``DEFAULT_CORES``; 0 turns the watch off)."""
    return EchoBudget(float(os.environ.get(CORES_ENV) or DEFAULT_CORES))


@functools.cache
def _executor() -> ThreadPoolExecutor:
    """One thread for every session of the process: numpy's and scipy's FFTs and filters let go of the GIL, so
    the windows cost CPU beside the event loop and the engine's tick, not time on either."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="echo-watch")


def echo_fields(echo: dict[str, Any] | None) -> dict[str, float]:
    """A window's result as ``session.metrics`` numbers (``echo_flagged`` 0/1; the leak and delay when found).
    A window in which the agent was silent gives none: it is no sign that a leak has gone (the live warning
    clears after clean windows, webapp/conversations/echo_health.py)."""
    if echo is None or echo.get("agent_silent"):
        return {}
    fields = {"echo_flagged": float(echo["flagged"]), "echo_peak_sigmas": echo["peak_sigmas"]}
    if echo["leak_db"] is not None:
        fields |= {"echo_leak_db": echo["leak_db"], "echo_delay_ms": echo["delay_ms"]}
    return fields
