"""A session's housekeeping, about once a second: the idle watchdog, the echo window and the Metrics event.

Kept apart from ``inference.session.dialogue``, which owns the session's state, connection and timers. This
owns what runs on the session's ``metrics`` timer while a connection is attached and the session is not
closed: closing an idle session, measuring the echo when a window is due, and assembling the Metrics event
from the worker, the slot, the outbox and the stream positions (the numbers' names and units are
``inference.session.metrics``). It sees the session only as a ``HousekeepingHost``.
"""

from __future__ import annotations

import time
from typing import Protocol

from inference.contracts import CloseReason, Metrics, SessionEvent
from inference.session.context import Attachment, SessionTimeouts, SlotDriver
from inference.session.echo_watch import EchoWatch, echo_fields
from inference.session.input_audio import InputAudio
from inference.session.metrics import session_metrics
from inference.session.named_timers import NamedTimers
from inference.session.recording import SessionRecorder
from inference.session.stream_positions import StreamPositions
from inference.session.tick_output import TickOutput

METRICS_PERIOD_S = 1.0


class HousekeepingHost(Protocol):
    """The session, as its housekeeping sees it (``inference.session.dialogue.DialogueSession``)."""

    @property
    def state(self) -> str: ...
    @property
    def slot(self) -> int | None: ...
    @property
    def attachment(self) -> Attachment | None: ...
    @property
    def user_paused(self) -> bool: ...
    @property
    def audio_started(self) -> bool: ...
    @property
    def last_activity(self) -> float: ...
    @property
    def input(self) -> InputAudio: ...
    @property
    def dropped_out(self) -> int: ...  # outbound audio dropped by earlier connections' outboxes
    @property
    def played_ms(self) -> float: ...  # from the last playback ack
    @property
    def echo(self) -> EchoWatch: ...
    @property
    def recorder(self) -> SessionRecorder: ...

    def close(self, reason: CloseReason) -> None: ...
    def emit(self, event: SessionEvent) -> None: ...  # to the connection


class Housekeeping:
    """One session's once-a-second work, on the session's ``metrics`` timer.

    Args:
        host: the session.
        worker: the engine worker (its tick timings and the slot's counters).
        timers: the session's timers (this one is ``metrics``).
        timeouts: the session's timeouts (the idle one).
        positions: the session's stream positions (the mouth-to-ear pair in Metrics).
        output: the session's engine output (the audio sent so far).
        period_ms: the engine's chunk period, to express queued frames as lag.
    """

    def __init__(
        self,
        host: HousekeepingHost,
        worker: SlotDriver,
        timers: NamedTimers,
        timeouts: SessionTimeouts,
        positions: StreamPositions,
        output: TickOutput,
        period_ms: float,
    ):
        self._host, self._worker, self._timers, self._timeouts = host, worker, timers, timeouts
        self._positions, self._output, self._period_ms = positions, output, period_ms

    def schedule(self) -> None:
        """Run about a second from now, unless already due (or the session is closed)."""
        if "metrics" not in self._timers and self._host.state != "closed":
            self._timers.start("metrics", METRICS_PERIOD_S, self._run)

    def metrics(self) -> dict[str, float]:
        host = self._host
        stats = self._worker.stats()
        counters = self._worker.take_slot_counters(host.slot) if host.slot is not None else None
        outbox = host.attachment.outbox if host.attachment is not None else None
        values = session_metrics(
            stats,
            counters,
            outbox,
            period_ms=self._period_ms,
            dropped=self._dropped(),
            sent_audio_ms=self._output.sent_audio_ms,
            played_ms=host.played_ms,
        )
        advice = counters.phase_advice if counters is not None else None
        return values | self._positions.heard_fields() | self._positions.advice_fields(advice)

    def _dropped(self) -> int:
        """Input dropped here plus outbound audio dropped by this and earlier connections' outboxes."""
        host = self._host
        current = host.attachment.outbox.dropped_audio if host.attachment is not None else 0
        return host.input.dropped + host.dropped_out + current

    def _run(self) -> None:
        """About once a second: Metrics to the connection, and the idle watchdog."""
        host = self._host
        self._timers.cancel("metrics")  # it fired: forget its handle
        if host.state == "closed" or host.attachment is None:
            return
        if not host.user_paused and time.monotonic() - host.last_activity > self._timeouts.idle_timeout_s:
            host.close("idle_timeout")
            return
        if host.audio_started and not host.user_paused:
            echo = host.echo.measure_if_due()  # a few ms every few seconds, between frames, off the tick's thread
            if echo is not None:
                host.recorder.event("echo", **echo)  # the recording's per-call echo and its course over time
            deferred = {"echo_windows_deferred": float(host.echo.deferred)} if host.echo.deferred else {}
            host.emit(Metrics(self.metrics() | echo_fields(echo) | deferred))
        self.schedule()
