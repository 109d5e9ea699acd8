"""What a running inference service reports about itself: its load, its sessions and its queue.

One builder (``service_status``) serves both deployments: the in-process default hands the status to
the console directly, a service process publishes it to the Redis registry on every heartbeat
(``inference.cluster.registry``). Plain dataclasses with dict round trips, no torch.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from inference.service import InferenceService
    from inference.session.dialogue import DialogueSession

ServiceState = Literal["serving", "draining", "down"]
SessionState = Literal["active", "paused", "detached", "queued"]
HISTORY_POINTS = 300  # one point a second: the last five minutes of ticks and occupancy
# Tick-time histogram bucket bounds (ms) for the metrics exporter; 80 ms is the Moshi/echo frame period.
TICK_BUCKETS_MS = (5.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 150.0, 250.0, 500.0, 1000.0)
PERSONA_PREVIEW_CHARS = 80


@dataclass(frozen=True)
class SessionStatus:
    """One session as the console lists it."""

    session_id: str
    user_key: str
    service_id: str
    engine: str
    state: SessionState
    duration_s: float
    persona: str | None = None
    voice: str | None = None
    frames_in: int = 0
    frames_out: int = 0
    dropped_frames: int = 0
    lag_ms: float = 0.0
    record: bool = False
    mode: str = "duplex"  # duplex | half_duplex | chat
    queue_position: int | None = None  # 1-based while queued
    estimated_wait_s: float | None = None


@dataclass(frozen=True)
class ServiceStatus:
    """One inference service: identity, load and health, as of ``heartbeat_at`` (unix time)."""

    service_id: str
    address: str  # where the web tier reaches it: tcp://host:port, unix:///path, or in-process
    host: str
    device: str
    engine: str
    checkpoint: str | None
    slots_used: int
    slots_total: int
    queue_length: int
    tick_ms_p50: float
    tick_ms_p99: float
    gpu_memory: dict[str, float]
    state: ServiceState
    heartbeat_at: float
    ticks: int = 0  # ticks stepped since the service started
    late_ticks: int = 0  # ticks that overran the engine's real-time period
    # Cumulative tick-time histogram over TICK_BUCKETS_MS (+Inf last), its sum (ms) and count.
    tick_buckets: tuple[int, ...] = ()
    tick_sum_ms: float = 0.0
    tick_count: int = 0
    down_reason: str | None = None
    history: tuple[tuple[float, float, float, int], ...] = ()  # (unix time, tick p50, tick p99, slots used)
    recent_tick_ms: tuple[float, ...] = ()
    capabilities: dict[str, Any] = field(default_factory=dict)  # the engine's, for pages rendered before a call
    # What the engine admits (engines.base.EngineCapacity: slots, full_context, call_mix, mean_call_s) and
    # admits_now: the sessions its memory and free slots take at this moment (the console's calls-held gauge).
    capacity: dict[str, Any] = field(default_factory=dict)
    sessions: tuple[SessionStatus, ...] = field(default_factory=tuple)

    @property
    def free_slots(self) -> int:
        return max(0, self.slots_total - self.slots_used)


class History:
    """What a status needs from earlier ones: a sparkline point a second and the cumulative tick histogram.

    The histogram takes the tick times the worker stepped since the previous status from its ring of
    recent ticks (the last 100: every tick while statuses come at least every 8 s at 80 ms a tick).
    """

    def __init__(self, size: int = HISTORY_POINTS):
        self.points: deque[tuple[float, float, float, int]] = deque(maxlen=size)
        self.buckets = [0] * (len(TICK_BUCKETS_MS) + 1)
        self.sum_ms = 0.0
        self.count = 0
        self._ticks_seen = 0

    def observe_ticks(self, ticks: int, recent_ms: tuple[float, ...]) -> None:
        new = ticks - self._ticks_seen
        self._ticks_seen = ticks
        if new <= 0:
            return
        for ms in recent_ms[-new:]:
            self.buckets[next((i for i, le in enumerate(TICK_BUCKETS_MS) if ms <= le), len(TICK_BUCKETS_MS))] += 1
            self.sum_ms += ms
            self.count += 1

    def note(self, p50: float, p99: float, slots_used: int, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if self.points and now - self.points[-1][0] < 1.0:
            return
        self.points.append((round(now, 2), round(p50, 3), round(p99, 3), slots_used))


def service_status(
    service: InferenceService,
    *,
    service_id: str,
    address: str,
    state: ServiceState,
    history: History,
) -> ServiceStatus:
    """Describe ``service`` now (call on its event loop: it reads the pool and the sessions)."""
    now_mono, now = time.monotonic(), time.time()
    pool = service.pool
    stats = service.worker.stats()
    slots_used = sum(owner is not None for owner in pool.owners) + len(pool.closing)
    history.note(stats.tick_ms_p50, stats.tick_ms_p99, slots_used, now)
    history.observe_ticks(stats.ticks, stats.recent_tick_ms)
    engine = service.capabilities.engine
    queue_positions = {id(s): i for i, s in enumerate(pool.queue, start=1)}
    sessions = []
    for session in list(service.sessions.values()):
        position = queue_positions.get(id(session))
        sessions.append(_session_status(session, service, service_id, engine, now_mono, position))
    checkpoint = service.config.checkpoint
    return ServiceStatus(
        service_id=service_id,
        address=address,
        host=socket.gethostname(),
        device=service.config.device,
        engine=engine,
        checkpoint=str(checkpoint) if checkpoint else None,
        slots_used=slots_used,
        slots_total=pool.num_slots,
        queue_length=len(pool.queue),
        tick_ms_p50=round(stats.tick_ms_p50, 3),
        tick_ms_p99=round(stats.tick_ms_p99, 3),
        gpu_memory={k: float(v) for k, v in service.engine.memory_snapshot().items()},
        state=state,
        heartbeat_at=round(now, 3),
        ticks=stats.ticks,
        late_ticks=stats.late_ticks,
        tick_buckets=tuple(history.buckets),
        tick_sum_ms=round(history.sum_ms, 3),
        tick_count=history.count,
        history=tuple(history.points),
        recent_tick_ms=tuple(round(v, 3) for v in stats.recent_tick_ms),
        # JSON's shapes (lists, not tuples): the same value a reader gets back from the registry.
        capabilities=json.loads(json.dumps(dataclasses.asdict(service.capabilities))),
        capacity=_capacity(service, slots_used),
        sessions=tuple(sessions),
    )


def _capacity(service: InferenceService, slots_used: int) -> dict[str, Any]:
    """The engine's own capacity and how many more it admits now (the worker's count as of its last tick)."""
    capacity = dataclasses.asdict(service.engine.capacity())
    free = max(service.pool.num_slots - slots_used, 0)
    memory = service.worker.admission[0]  # None: only the slots limit admission
    capacity["admits_now"] = free if memory is None else min(free, max(memory, 0))
    return capacity


def _session_status(
    session: DialogueSession,
    service: InferenceService,
    service_id: str,
    engine: str,
    now_mono: float,
    queue_position: int | None,
) -> SessionStatus:
    # The same figures as the session's own Metrics event, read without resetting its maxima.
    frames_in = frames_out = 0
    dropped = session.dropped_in + session.dropped_out
    if session.attachment is not None:
        dropped += session.attachment.outbox.dropped_audio
    lag_ms = 0.0
    if session.slot is not None and session.state != "queued":
        counters = service.worker.peek_slot_counters(session.slot)
        frames_in, frames_out = counters.frames_in, counters.frames_out
        dropped += counters.dropped_in + counters.trimmed
        queued_out = len(session.attachment.outbox) if session.attachment is not None else 0
        lag_ms = (counters.inbox_depth + queued_out) * session.caps.chunk_period_ms
    state: SessionState
    if session.state == "queued":
        state = "queued"
    elif session.attachment is None:
        state = "detached"
    elif session.user_paused:
        state = "paused"
    else:
        state = "active"
    persona = session.persona[:PERSONA_PREVIEW_CHARS] if session.persona else None
    return SessionStatus(
        session_id=session.session_id,
        user_key=session.user_key,
        service_id=service_id,
        engine=engine,
        state=state,
        duration_s=round(now_mono - session.created_at, 1),
        persona=persona,
        voice=session.voice.voice_id if session.voice is not None else None,
        frames_in=frames_in,
        frames_out=frames_out,
        dropped_frames=dropped,
        lag_ms=round(lag_ms, 1),
        record=session.recorded,
        mode=session.mode,
        queue_position=queue_position,
        estimated_wait_s=service.pool.estimated_wait_s(queue_position) if queue_position else None,
    )


def status_to_dict(status: ServiceStatus) -> dict[str, Any]:
    return dataclasses.asdict(status)


def status_from_dict(data: dict[str, Any]) -> ServiceStatus:
    """Rebuild a status read from the registry; unknown keys (a newer service) are ignored."""
    known = {f.name for f in dataclasses.fields(ServiceStatus)}
    values = {k: v for k, v in data.items() if k in known}
    session_fields = {f.name for f in dataclasses.fields(SessionStatus)}
    values["sessions"] = tuple(
        SessionStatus(**{k: v for k, v in s.items() if k in session_fields}) for s in data.get("sessions") or ()
    )
    values["history"] = tuple(tuple(p) for p in data.get("history") or ())
    values["recent_tick_ms"] = tuple(data.get("recent_tick_ms") or ())
    values["tick_buckets"] = tuple(data.get("tick_buckets") or ())
    return ServiceStatus(**values)
