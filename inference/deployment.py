"""The inference side as one web process sees it: who answers its calls, and whether new calls are let in.

``inference.api`` is the facade; it delegates to the one ``Deployment`` this process owns. Behind it is
either a Redis registry of several services (``PARLEY_REGISTRY_URL``: placement through
``inference.cluster.routing``, the admin flags in Redis), or one service, in this process or behind a socket
(``inference.embedded`` knows which), which is then the whole cluster under ``IN_PROCESS_ID`` and whose
admin flags live here. Admission policy is applied here, before the service sees a request.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from inference import embedded
from inference.cluster.registry import admission_stopped_error
from inference.contracts import ParleyError, SessionRequest, WorkerSnapshot
from inference.status import History, ServiceStatus, service_status

IN_PROCESS_ID = "in-process"


class Deployment:
    """Routing, admission, draining and statuses for this process; ``stop`` forgets all but the counts."""

    def __init__(self) -> None:
        self.admissions_refused: collections.Counter[str] = collections.Counter()  # reason -> count (metrics)
        self._reset()

    def _reset(self) -> None:
        self._routing = None  # inference.cluster.routing.Router for the current config, built on first use
        self._admission_open = True  # without a registry the flags live here (one process); with one, in Redis
        self._draining = False
        self._history: History | None = None  # the in-process service's recent statuses

    def _router(self):
        config = embedded.current_config()
        if not config.registry_url:
            return None
        if self._routing is None or self._routing.config is not config:
            from inference.cluster.routing import Router

            self._routing = Router(config)
        return self._routing

    # ---- sessions -------------------------------------------------------------------------------

    async def open_session(self, request: SessionRequest) -> Any:  # an inference.api.SessionHandle
        try:
            return await self._open_session(request)
        except ParleyError as exc:
            if exc.code == "resource_exhausted":
                self.admissions_refused["admission_stopped" if exc.param == "admission" else "capacity"] += 1
            raise

    async def _open_session(self, request: SessionRequest) -> Any:
        router = self._router()
        if router is not None:
            return await router.open_session(request)
        socket_path = embedded.remote_socket()
        if socket_path is not None:
            from inference.transport.client import RemoteSessionHandle

            return await RemoteSessionHandle.open(socket_path, request)
        service = await embedded.local_service()
        if request.user_key not in service.sessions:  # a returning user reaches their session whatever the flags
            if not self._admission_open:
                raise admission_stopped_error()
            if self._draining:
                raise ParleyError(
                    "the inference service is draining: it finishes its sessions and takes no new ones",
                    code="resource_exhausted",
                    error_type="server_error",
                )
        return await service.open_session(request)

    async def end_session(self, session_id: str, reason: str) -> bool:
        router = self._router()
        if router is not None:
            return await router.end_session(session_id, reason)
        socket_path = embedded.remote_socket()
        if socket_path is not None:
            from inference.transport.client import remote_end_session

            return await remote_end_session(socket_path, session_id, reason)
        return await embedded.on_service_loop(lambda service: service.end_session(session_id, reason))

    # ---- what the console shows ---------------------------------------------------------------------

    async def services(self) -> list[ServiceStatus]:
        router = self._router()
        if router is not None:
            return await router.services()
        socket_path = embedded.remote_socket()
        if socket_path is not None:
            from inference.transport.client import remote_status

            return [await remote_status(socket_path)]
        if embedded.warm_start_status()["state"] == "warming":
            # the in-process service is still being built (a checkpoint fetched from the hub takes minutes):
            # nothing to list yet, and waiting for it here would stall the console that shows the download
            return []
        return [await embedded.on_service_loop(self._local_status)]

    def _local_status(self, service) -> ServiceStatus:
        if self._history is None:
            self._history = History()
        state = "draining" if self._draining else "serving"
        return service_status(
            service, service_id=IN_PROCESS_ID, address=IN_PROCESS_ID, state=state, history=self._history
        )

    async def occupancy(self) -> list[WorkerSnapshot]:
        router = self._router()
        if router is not None:
            from inference.transport.client import remote_occupancy

            live = [s for s in await router.services() if s.state != "down"]
            return [snapshot for s in live for snapshot in await remote_occupancy(s.address)]
        socket_path = embedded.remote_socket()
        if socket_path is not None:
            from inference.transport.client import remote_occupancy

            return await remote_occupancy(socket_path)
        return await embedded.on_service_loop(lambda service: service.occupancy())

    def capabilities_preview(self) -> dict:
        config = embedded.current_config()
        if config.registry_url:
            from inference.cluster.registry import capabilities_now

            preview = capabilities_now(config.registry_url, config.heartbeat_timeout_s, config.inference_token)
            if preview is None:
                raise ParleyError("no inference service is serving", code="internal_error", error_type="server_error")
            return preview
        socket_path = embedded.remote_socket()
        if socket_path is not None:
            from inference.transport.client import remote_capabilities

            caps = remote_capabilities(socket_path)
        else:
            caps = embedded.built_service().capabilities  # built, not started: the first call reuses its engine
        preview = dataclasses.asdict(caps)
        preview["extra"] = dict(caps.extra)
        return preview

    # ---- admin controls -------------------------------------------------------------------------

    async def set_draining(self, service_id: str, draining: bool) -> bool:
        router = self._router()
        if router is not None:
            return await router.set_draining(service_id, draining)
        if service_id != IN_PROCESS_ID or embedded.remote_socket() is not None:
            return False
        self._draining = draining
        return True

    async def set_admission(self, open_: bool) -> None:
        router = self._router()
        if router is not None:
            await router.set_admission(open_)
        else:
            self._admission_open = open_

    async def admission_open(self) -> bool:
        router = self._router()
        return await router.admission_open() if router is not None else self._admission_open

    async def stop(self) -> None:
        """Stop routing, close this process's links and forget the flags and history (the next call re-reads the
        env); counts stay."""
        from inference.transport.link import close_links

        router = self._routing
        self._reset()
        if router is not None:
            await router.stop()
        await close_links()
