"""``/ops/metrics``: this web process's Prometheus endpoint (docs/deploy.md, "Metrics").

It serves the cluster's families from the same statuses the console shows
(``api.status_metric_families`` over ``api.services()``), plus what only this process knows: error
events sent to its clients by code and the admissions it refused. Scrapers authenticate as a staff user with the
``operations.view_console`` permission: a session cookie, or ``Authorization: Bearer <API key>``.
Each inference service process exposes its own families on ``--metrics-port`` (loopback).
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from inference import api
from inference.contracts import ParleyError
from webapp.accounts.services import apikey_authenticate
from webapp.common import loop_load, throttling
from webapp.operations.access import VIEW_CONSOLE, may

PROCESS_REGISTRY = CollectorRegistry(auto_describe=True)
ERRORS_SENT = Counter(
    "parley_client_errors", "Error events sent to clients, by code.", ["code"], registry=PROCESS_REGISTRY
)
# Messages this process's realtime sockets sent, by the path they took (conversations.socket_lane): plain integers
# the consumers bump for each message (a Counter's lock each time would cost more than the lane saves).
MESSAGES_SENT = {"lane": 0, "framework": 0}
# Messages they received, by the path they took in: a live call's audio frame by the inbound lane
# (conversations.inbound_lane), every other message through daphne's queue and channels' dispatch.
MESSAGES_RECEIVED = {"lane": 0, "framework": 0}
# Binary frames parsed off the sockets' bytes by the inbound lane's reader (conversations.frame_reader); autobahn
# parses the rest.
FRAMES_READ = {"reader": 0}
# A live call's output events (the session's audio and text), by the way they reached the socket: taken as the
# session made them by the outbound lane (conversations.outbound_lane), or through the handle's queue and the pump.
OUTPUT_EVENTS = {"direct": 0, "queue": 0}
# The socket lane's writes, by how they left: sent to the socket at once, or (partly) through Twisted's buffer.
SOCKET_WRITES = {"at_once": 0, "buffered": 0}


def count_error(code: str) -> None:
    ERRORS_SENT.labels(code=code).inc()


class _ClusterCollector(Collector):
    """Families of one ``api.services()`` read, plus this process's refused admissions."""

    def __init__(self, statuses: list[api.ServiceStatus], registry_error: str | None):
        self.statuses, self.registry_error = statuses, registry_error

    def collect(self):
        yield from api.status_metric_families(self.statuses)
        refused = CounterMetricFamily(
            "parley_admissions_refused", "New calls this process refused, by reason.", labels=["reason"]
        )
        for reason in ("capacity", "admission_stopped"):
            refused.add_metric([reason], api.admissions_refused.get(reason, 0))
        load = loop_load.current()
        refused.add_metric(["web_process_busy"], load.refused if load else 0)
        yield refused
        late = GaugeMetricFamily(
            "parley_web_loop_late_ms",
            "How late this process's event loop runs its callbacks: the 90th percentile over the last 5 s. New calls "
            "are refused while it is over PARLEY_WEB_LOOP_LAG_MS.",
        )
        late.add_metric([], load.p90_ms() if load else 0.0)
        yield late
        yield _by_path(
            "parley_socket_messages_sent",
            "Messages this process sent to realtime callers, by path: written by the socket lane, or through "
            "channels, daphne and autobahn.",
            MESSAGES_SENT,
        )
        yield _by_path(
            "parley_socket_messages_received",
            "Messages this process received from realtime callers, by path: audio frames taken by the inbound lane, "
            "or through daphne's queue and channels' dispatch.",
            MESSAGES_RECEIVED,
        )
        yield _by_path(
            "parley_socket_frames_read",
            "Binary frames from realtime callers parsed by the inbound lane's frame reader; autobahn parses the rest.",
            FRAMES_READ,
        )
        yield _by_path(
            "parley_socket_output_events",
            "A live call's audio and text events this process passed to its realtime sockets, by path: sent by the "
            "outbound lane as the session made them, or through the session's queue and the socket's pump task.",
            OUTPUT_EVENTS,
        )
        yield _by_path(
            "parley_socket_writes",
            "The socket lane's writes to realtime sockets, by path: sent to the socket at once, or (the part the "
            "kernel did not take) through the server's write buffer.",
            SOCKET_WRITES,
        )
        reachable = GaugeMetricFamily("parley_services_readable", "1 when this process could read the services.")
        reachable.add_metric([], 0.0 if self.registry_error else 1.0)
        yield reachable


def _by_path(name: str, documentation: str, counts: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=["path"])
    for path, count in counts.items():
        family.add_metric([path], count)
    return family


async def _scraper(request: HttpRequest):
    """The scraping user, or a ``throttling.Refusal`` while this address is over its wrong-key rate."""
    user = await request.auser()
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if not user.is_authenticated and scheme.lower() == "bearer" and key.strip():
        ip = request.META.get("REMOTE_ADDR") or "unknown"
        if refusal := await throttling.key_refusal(ip):
            return refusal
        user = await sync_to_async(apikey_authenticate)(raw_key=key.strip())
        if user is None:
            await throttling.record_key_failure(ip)
        user = user or AnonymousUser()
    return user


@require_GET
async def metrics(request: HttpRequest) -> HttpResponse:
    user = await _scraper(request)
    if isinstance(user, throttling.Refusal):
        headers = {"Retry-After": str(user.retry_after_s)}
        return HttpResponse(user.message + "\n", status=429, content_type="text/plain", headers=headers)
    if not await sync_to_async(may)(user, VIEW_CONSOLE):
        return HttpResponse("staff with operations.view_console only\n", status=403, content_type="text/plain")
    try:
        statuses, error = await api.services(), None
    except ParleyError as exc:
        statuses, error = [], exc.message
    cluster = CollectorRegistry(auto_describe=False)
    cluster.register(_ClusterCollector(statuses, error))
    body = generate_latest(cluster) + generate_latest(PROCESS_REGISTRY)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
