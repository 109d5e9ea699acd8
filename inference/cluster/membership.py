"""A service process's part in a deployment of several: its TCP listener, its heartbeat, its metrics port.

``python -m inference serve`` always serves its unix socket; ``Membership`` adds what a GPU host
on another machine needs: a TCP listener (same framing, same connection handler, guarded by the
shared secret's handshake), a status signed with that secret and published every ``heartbeat_s``
to the Redis registry when ``PARLEY_REGISTRY_URL`` is set, and a Prometheus endpoint on a loopback
port when asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable

from inference.cluster.exporter import StatusCollector, serve_metrics
from inference.cluster.registry import Heartbeat
from inference.config import InferenceConfig
from inference.status import ServiceStatus
from inference.transport import wire

logger = logging.getLogger(__name__)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def parse_host_port(value: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:port`` for IPv6) -> (host, port); a clear ValueError otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"expected host:port, got {value!r}")
    return host.strip("[]"), int(port)


class Membership:
    """Start with ``await membership.start(handler)``; ``await membership.stop()`` withdraws cleanly.

    Args:
        service: the running ``InferenceService``.
        config: its configuration (``registry_url``, ``service_id``, ``heartbeat_s``).
        socket_path: the unix socket it serves (its address when there is no TCP listener).
        tcp: ``host:port`` to listen on, or None.
        advertise: the ``host:port`` the web tier should dial (default: the TCP bind, or this host's
            name when bound to every interface).
        metrics_port: serve Prometheus metrics on ``127.0.0.1:<port>``, or None.
    """

    def __init__(
        self,
        service,
        config: InferenceConfig,
        *,
        socket_path: str,
        tcp: str | None = None,
        advertise: str | None = None,
        metrics_port: int | None = None,
    ):
        self.service = service
        self.config = config
        self.service_id = config.service_id or f"{socket.gethostname()}-{os.getpid()}"
        self.socket_path = socket_path
        self.tcp = parse_host_port(tcp) if tcp else None
        self.advertise = advertise
        self.metrics_port = metrics_port
        self.collector = StatusCollector()
        self.heartbeat: Heartbeat | None = None
        self._server: asyncio.AbstractServer | None = None
        self._task: asyncio.Task | None = None
        self._stop_metrics: Callable[[], None] | None = None

    @property
    def address(self) -> str:
        if self.tcp is None:
            return f"unix://{self.socket_path}"
        if self.advertise:
            return f"tcp://{self.advertise}"
        host, port = self.tcp
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        return f"tcp://{host}:{port}"

    async def start(self, handler: Handler) -> None:
        if self.tcp is not None:
            host, port = self.tcp
            self._server = await asyncio.start_server(handler, host, port, limit=wire.MAX_FRAME_BYTES)
            print(f"ready: serving {self.service.capabilities.engine!r} on tcp://{host}:{port}", flush=True)
        self.heartbeat = Heartbeat(
            self.service,
            redis_url=self.config.registry_url,
            secret=self.config.inference_token,
            service_id=self.service_id,
            address=self.address,
            interval_s=self.config.heartbeat_s,
            on_status=lambda status: self.collector.publish([status]),
        )
        self._task = asyncio.get_running_loop().create_task(self.heartbeat.run())
        if self.metrics_port is not None:
            self._stop_metrics = serve_metrics(self.metrics_port, self.collector)
            print(f"metrics: http://127.0.0.1:{self.metrics_port}/metrics", flush=True)
        if self.config.registry_url:
            print(f"registry: {self.service_id} at {self.address} heartbeats every {self.config.heartbeat_s:g} s")

    def status(self) -> ServiceStatus:
        """The status now (the ``status`` one-shot call of a single remote service)."""
        assert self.heartbeat is not None
        return self.heartbeat.status()

    async def stop(self) -> None:
        """Stop beating and withdraw the record (sessions end with the service), close the listener."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.heartbeat is not None:
            await self.heartbeat.withdraw()
        if self._server is not None:
            self._server.close()
        if self._stop_metrics is not None:
            self._stop_metrics()
