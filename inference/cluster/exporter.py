"""Prometheus metric families built from service statuses (``inference.status``).

The same families come out of every process that exposes metrics: an inference service process
(``python -m inference serve --metrics-port N``, its own status) and each web process
(``/ops/metrics``, every service the registry knows). Numbers are read from the statuses the
console shows, so a scrape and the console agree by construction of one source, not two.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from inference.status import TICK_BUCKETS_MS, ServiceStatus

SESSION_STATES = ("active", "paused", "detached", "queued")
SERVICE_STATES = ("serving", "draining", "down")


def status_families(statuses: Iterable[ServiceStatus]) -> Iterator[Metric]:
    """Gauges of sessions, slots and queues, the tick histogram and counters, one label set per service."""
    statuses = list(statuses)
    sessions = GaugeMetricFamily("parley_sessions", "Sessions by state.", labels=["service", "state"])
    slots_used = GaugeMetricFamily("parley_slots_used", "Engine slots held by sessions.", labels=["service"])
    slots_total = GaugeMetricFamily("parley_slots_total", "Engine slots.", labels=["service"])
    capacity = GaugeMetricFamily(
        "parley_capacity_sessions", "Sessions the engine admits (at the call mix it plans for).", labels=["service"]
    )
    queue = GaugeMetricFamily("parley_queue_length", "Sessions waiting for a slot.", labels=["service"])
    wait = GaugeMetricFamily(
        "parley_queue_wait_estimate_seconds", "Estimated wait of the last queued session.", labels=["service"]
    )
    state = GaugeMetricFamily("parley_service_state", "1 for the service's current state.", labels=["service", "state"])
    dropped = GaugeMetricFamily(
        "parley_session_dropped_frames", "Frames dropped by the service's current sessions.", labels=["service"]
    )
    ticks = HistogramMetricFamily("parley_tick_seconds", "Engine tick duration.", labels=["service"])
    late = CounterMetricFamily("parley_late_ticks", "Ticks that overran the real-time period.", labels=["service"])
    for status in statuses:
        sid = status.service_id
        counts = Counter(s.state for s in status.sessions)
        for name in SESSION_STATES:
            sessions.add_metric([sid, name], counts.get(name, 0))
        slots_used.add_metric([sid], status.slots_used)
        slots_total.add_metric([sid], status.slots_total)
        capacity.add_metric([sid], status.capacity.get("call_mix", status.slots_total))
        queue.add_metric([sid], status.queue_length)
        waits = [s.estimated_wait_s for s in status.sessions if s.estimated_wait_s is not None]
        wait.add_metric([sid], max(waits, default=0.0))
        for name in SERVICE_STATES:
            state.add_metric([sid, name], 1.0 if status.state == name else 0.0)
        dropped.add_metric([sid], sum(s.dropped_frames for s in status.sessions))
        if status.tick_buckets:
            cumulative, buckets = 0, []
            for bound, count in zip((*TICK_BUCKETS_MS, float("inf")), status.tick_buckets, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound / 1000.0), cumulative))
            ticks.add_metric([sid], buckets, sum_value=status.tick_sum_ms / 1000.0)
        late.add_metric([sid], status.late_ticks)
    yield from (sessions, slots_used, slots_total, capacity, queue, wait, state, dropped, ticks, late)


class StatusCollector(Collector):
    """A collector over whatever status the owner last published (set from the service's loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._statuses: tuple[ServiceStatus, ...] = ()

    def publish(self, statuses: Iterable[ServiceStatus]) -> None:
        with self._lock:
            self._statuses = tuple(statuses)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            statuses = self._statuses
        yield from status_families(statuses)


def serve_metrics(port: int, collector: Collector, host: str = "127.0.0.1") -> Callable[[], None]:
    """Expose ``collector`` on ``http://host:port/metrics`` (a thread); returns the function that stops it."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, thread = start_http_server(port, addr=host, registry=registry)

    def stop() -> None:
        server.shutdown()
        thread.join(timeout=5)

    return stop
