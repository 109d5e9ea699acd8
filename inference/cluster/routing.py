"""The web tier's side of a deployment with several inference services (``PARLEY_REGISTRY_URL`` set).

``Router`` places each new session on a service through the registry, keeps the user's later
connections (from any web process) on the service that holds their session, and watches the
registry: when a service misses its heartbeats, every session this process has open there is ended
with ``engine_failed`` and the reason, and new calls go to the survivors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref

from inference.cluster.registry import Registry
from inference.config import InferenceConfig
from inference.contracts import ParleyError, SessionRequest
from inference.status import ServiceStatus

logger = logging.getLogger(__name__)

MAX_PLACEMENT_ATTEMPTS = 3  # services tried for one new call before its caller hears why


class Router:
    """Placement, failure watch and admin controls over the registry (one per web process)."""

    def __init__(self, config: InferenceConfig):
        assert config.registry_url
        self.config = config
        self.registry = Registry(
            config.registry_url, heartbeat_timeout_s=config.heartbeat_timeout_s, secret=config.inference_token
        )
        self._handles: dict[str, weakref.WeakSet] = {}  # service_id -> this process's open handles there
        self._watch: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None

    async def open_session(self, request: SessionRequest):
        """Open (or reattach to) the user's session on the service the registry picks."""
        from inference.transport.client import RemoteSessionHandle

        self._ensure_watch()
        unreachable: set[str] = set()
        while True:
            service = await self.registry.route(request.user_key, avoid=frozenset(unreachable))
            try:
                handle = await RemoteSessionHandle.open(service.address, request, service_id=service.service_id)
            except ParleyError as exc:
                if exc.code == "resource_exhausted" or len(unreachable) >= MAX_PLACEMENT_ATTEMPTS - 1:
                    raise
                # Dead but not yet marked down (killed a moment ago): place the call on another one.
                logger.warning("routing.unreachable", extra={"service_id": service.service_id, "detail": exc.message})
                unreachable.add(service.service_id)
                continue
            self._handles.setdefault(service.service_id, weakref.WeakSet()).add(handle)
            return handle

    async def services(self) -> list[ServiceStatus]:
        return await self.registry.services()

    async def end_session(self, session_id: str, reason: str) -> bool:
        from inference.transport.client import remote_end_session

        for service in await self.registry.services():
            if service.state != "down" and any(s.session_id == session_id for s in service.sessions):
                return await remote_end_session(service.address, session_id, reason)
        return False

    async def set_draining(self, service_id: str, draining: bool) -> bool:
        if not any(s.service_id == service_id for s in await self.registry.services()):
            return False
        await self.registry.set_draining(service_id, draining)
        return True

    async def set_admission(self, open_: bool) -> None:
        await self.registry.set_admission(open_)

    async def admission_open(self) -> bool:
        return await self.registry.admission_open()

    # ---- the failure watch ------------------------------------------------------------------------

    def _ensure_watch(self) -> None:
        loop = asyncio.get_running_loop()
        if self._watch is None or self._watch[0] is not loop or self._watch[1].done():
            self._watch = (loop, loop.create_task(self._watch_loop()))

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            try:
                services = await self.registry.services()
            except ParleyError as exc:
                logger.warning("routing.registry_unreachable", extra={"detail": exc.message})
                continue
            for service in services:
                if service.state == "down":
                    await self._fail_callers(service)

    async def _fail_callers(self, service: ServiceStatus) -> None:
        handles = list(self._handles.pop(service.service_id, ()))
        if handles:
            logger.warning(
                "routing.service_down",
                extra={"service_id": service.service_id, "detail": service.down_reason, "sessions": len(handles)},
            )
        reason = f"inference service {service.service_id} is down: {service.down_reason}"
        for handle in handles:
            with contextlib.suppress(Exception):
                await handle.fail(reason)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch[1].cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._watch[1]
            self._watch = None
