"""What a session's once-a-second ``Metrics`` event says: the worker's tick timings and the slot's counters.

Kept apart from ``inference.session.housekeeping``, which gathers the inputs once a second, so that this module
owns the names and units of the numbers a client sees (docs/protocol.md lists them).
"""

from __future__ import annotations

from inference.session.outbox import Outbox
from inference.slots.worker import SlotCounters, WorkerStats


def session_metrics(
    stats: WorkerStats,
    counters: SlotCounters | None,
    outbox: Outbox | None,
    *,
    period_ms: float,
    dropped: int,
    sent_audio_ms: float,
    played_ms: float,
) -> dict[str, float]:
    """Metrics of one session.

    Args:
        stats: the worker's tick timings.
        counters: the slot's counters since the last call (taken, so they reset); None before a slot.
        outbox: the current connection's outbox; None while detached.
        period_ms: the engine's chunk period, to express queued frames as lag.
        dropped: frames the session and its connections' outboxes dropped so far.
        sent_audio_ms: agent audio sent so far; played_ms: what the client last said it had played.
    """
    values: dict[str, float] = {
        "tick_ms_p50": round(stats.tick_ms_p50, 3),
        "tick_ms_p99": round(stats.tick_ms_p99, 3),
        "late_ticks": stats.late_ticks,
        "dropped_frames": dropped,
    }
    if counters is None:
        return values
    queued_out = len(outbox) if outbox is not None else 0
    return values | {
        "frames_in": counters.frames_in,
        "frames_out": counters.frames_out,
        "underruns": counters.underruns,
        "dropped_frames": dropped + counters.dropped_in + counters.trimmed,
        "trimmed_frames": counters.trimmed,
        "prefill_dropped_frames": counters.dropped_in,  # from before the model listened (a prefill, a resume)
        "input_queue_frames": counters.inbox_depth,
        "lag_ms": (counters.inbox_depth + queued_out) * period_ms,
        "out_lag_ms": queued_out * period_ms,  # the agent's audio the server has made and not yet sent
        "in_wait_ms_max": round(counters.max_in_wait_s * 1000.0, 1),
        "out_wait_ms_max": outbox.take_max_wait_ms() if outbox is not None else 0.0,
        "unplayed_ms": round(max(0.0, sent_audio_ms - played_ms), 1) if played_ms else 0.0,
    }
