"""The in-process inference service behind the facade, and the configuration the facade reads.

``inference.api`` offers the calls; the ``EmbeddedService`` this process owns (one, ``_process``, reached
through the module-level names at the end) decides which service answers them in this process. In
the embedded default that is one ``InferenceService`` per process. It is bound to the event loop it
started on; a call from another loop (pytest-asyncio gives each test its own) restarts it there,
reusing the already warmed-up engine. With ``PARLEY_INFERENCE_URL`` set, the service is another
process and only the configuration lives here.

Warm start: a web process may ask, as it starts, for the engine to be loaded and warmed and one start (the
page's default persona and voice) prefilled in a background thread, before the server's loop runs any call.
The first call's service then takes that engine as is, and its start is a prefill-cache hit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Literal

from inference.config import InferenceConfig
from inference.contracts import ParleyError, VoiceRef

if TYPE_CHECKING:  # the web tier imports the facade: it loads the service and engines only when it runs them
    from inference.engines.base import Engine

# Said to callers instead of the real error, whose message names server paths (checkpoints, devices).
ENGINE_UNAVAILABLE = "The inference engine is not available; the server log has the details."

WarmState = Literal["off", "warming", "ready", "failed"]


class WarmStart:
    """One process's warm start: where it is (``state``, ``stage`` in words) and when it is over (``done``)."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a forked child (a test's live server) has not warmed anything itself
        self.state: WarmState = "warming"
        self.stage = "starting"
        self.done = threading.Event()

    def status(self) -> dict[str, str]:
        return {"state": self.state, "stage": self.stage}


class EmbeddedService:
    """This process's in-process service (built on first use, restarted on a new loop) and the configuration."""

    def __init__(self) -> None:
        self._config: InferenceConfig | None = None
        self._service = None  # inference.service.InferenceService, imported lazily
        self._starting: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None
        self._warm: WarmStart | None = None
        self._pid = os.getpid()  # the process the service and configuration above were made in
        self._building = threading.Lock()  # built_service from a view's thread and from the warm-up thread

    def current_config(self) -> InferenceConfig:
        """The configuration from the environment (read once), or the one ``start`` was given."""
        if self._config is None:
            self._config = InferenceConfig.from_env()
        return self._config

    def remote_socket(self) -> str | None:
        """The service process's socket in remote mode; None when the service runs in this process."""
        config = self.current_config()
        return config.socket_path if config.inference_url else None

    async def start(self, engine_instance: Engine | None, overrides: dict[str, Any]) -> None:
        """Start the in-process service on the running loop with config overrides (after ``stop``)."""
        from inference.service import InferenceService

        config = InferenceConfig.from_env().with_overrides(**overrides)
        self._config = config
        if config.inference_url:
            return  # remote mode: the service process owns its own configuration
        service = InferenceService(config, engine_instance)
        await service.start()
        self._service = service

    async def stop(self) -> None:
        """Stop the in-process service, if one runs; the next call re-reads the env."""
        service, self._service, self._config = self._service, None, None
        if service is None:
            return
        if service.usable_here:
            await service.stop()
        else:
            service.stop_worker()

    def forget_inherited_service(self) -> None:
        """Drop a service and configuration inherited through ``fork`` (a test's live server child).

        The parent's service belongs to the parent's threads and loop, and its configuration was read from
        the parent's environment; the child reads its own ``PARLEY_*`` on its first call instead. A warm start the
        child began itself (as its application loaded) is kept, with the service it builds.
        """
        if self._warm is not None and self._warm.pid == os.getpid():
            return
        self._service, self._config, self._starting, self._warm = None, None, None, None

    # ---- warm start --------------------------------------------------------------------------------

    def begin_warm_start(self, persona: str | None, voice: VoiceRef | None = None) -> bool:
        """Build and warm the in-process engine and prefill (persona, voice) in a background thread.

        Returns at once: False when the service is another process (it warms itself) or a warm start already
        ran in this process. The first session waits for a warm-up still running rather than load twice.
        """
        if self._pid != os.getpid():  # forked: what the parent made is not this process's to warm
            self._service, self._config, self._starting, self._warm = None, None, None, None
            self._building, self._pid = threading.Lock(), os.getpid()
        config = self.current_config()
        if config.inference_url or config.registry_url:
            return False
        if self._warm is not None and self._warm.pid == os.getpid():
            return False
        warm = self._warm = WarmStart()
        thread = threading.Thread(target=self._warm_up, args=(warm, persona, voice), name="warm-start", daemon=True)
        thread.start()
        return True

    def warm_start_status(self) -> dict[str, str]:
        """``state`` (off, warming, ready, failed) and ``stage`` (what it is doing, in words)."""
        warm = self._warm
        if warm is None or warm.pid != os.getpid():
            return {"state": "off", "stage": ""}
        return warm.status()

    def _warm_up(self, warm: WarmStart, persona: str | None, voice: VoiceRef | None) -> None:
        from inference.engines.base import SlotConfig

        def progress(fraction: float, stage: str) -> None:
            warm.stage = stage

        try:
            service = self.built_service()
            if not service.warmed:
                service.engine.warmup(progress)
                service.warmed = True
            warm.stage = "preparing the default persona and voice"
            service.engine.prepare_start(SlotConfig(persona=persona, voice=voice))
            warm.state, warm.stage = "ready", ""
        except Exception as exc:  # the first call loads the engine itself and reports its error
            logging.getLogger("inference.api").error("inference.warm_start_failed: %s", exc, exc_info=exc)
            warm.state, warm.stage = "failed", ""
        finally:
            warm.done.set()

    async def _warm_up_over(self) -> None:
        warm = self._warm
        if warm is not None and warm.pid == os.getpid() and not warm.done.is_set():
            await asyncio.to_thread(warm.done.wait)

    def _foreign_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the in-process service runs on, when that loop is alive in another thread."""
        if self._service is None or not self._service.started or self._service.usable_here:
            return None
        loop = self._service.loop
        return loop if loop is not None and loop.is_running() and not loop.is_closed() else None

    async def on_service_loop(self, make_call):
        """Run ``make_call(service)`` on the service's own loop (a sync view's async_to_sync runs elsewhere)."""
        foreign = self._foreign_loop()
        if foreign is None:
            return make_call(await self.local_service())

        async def call():
            return make_call(self._service)

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), foreign))

    async def local_service(self):
        """The in-process service, started (or restarted) on the running loop.

        A service whose loop still runs in another thread is never restarted from here: that would end
        every live call. Sessions must be opened on the service's loop (the ASGI server's loop).
        """
        if self._service is not None and self._service.usable_here:
            return self._service
        if self._foreign_loop() is not None:
            raise ParleyError(
                "the in-process inference service runs on another event loop; open sessions from the ASGI "
                "server's loop, or run the service as a process (PARLEY_INFERENCE_URL)",
                code="internal_error",
                error_type="server_error",
            )
        loop = asyncio.get_running_loop()
        if self._starting is None or self._starting[0] is not loop:  # one start per loop, however many callers wait
            self._starting = (loop, loop.create_task(self._restart_here()))
        task = self._starting[1]
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and self._starting is not None and self._starting[1] is task:
                self._starting = None

    async def _restart_here(self):
        from inference.service import InferenceService

        await self._warm_up_over()  # its engine is the one to start with, warmed once
        old = self._service
        engine, warmed = None, False
        if old is not None:
            old.stop_worker()  # its loop is gone or different; its sessions went with it
            if _same_engine_config(old.config, self.current_config()):
                engine, warmed = old.engine, old.warmed
        try:
            service = InferenceService(self.current_config(), engine, warmed=warmed)
            await service.start()
        except Exception as exc:
            raise _engine_failure(exc, self.current_config().engine) from exc
        self._service = service
        return service

    def built_service(self):
        """The in-process service, built but not started if none exists yet (the first call reuses its engine)."""
        with self._building:
            if self._service is None:
                from inference.service import InferenceService

                try:
                    self._service = InferenceService(self.current_config())
                except Exception as exc:
                    raise _engine_failure(exc, self.current_config().engine) from exc
            return self._service


def _engine_failure(exc: Exception, engine: str) -> ParleyError:
    """Log why the engine could not be built or warmed up; the caller gets ENGINE_UNAVAILABLE only."""
    logging.getLogger("inference.api").error("inference.engine_load_failed: engine %r: %s", engine, exc, exc_info=exc)
    return ParleyError(ENGINE_UNAVAILABLE, code="engine_failed", error_type="server_error")


def _same_engine_config(a: InferenceConfig, b: InferenceConfig) -> bool:
    """Whether an engine built for ``a`` can serve ``b`` as is (every field the engine is built from)."""
    keys = (
        "engine",
        "checkpoint",
        "slots",
        "device",
        "dtype",
        "lockstep_backend",
        "echo_delay_frames",
        "echo_prefill_ticks",
    )
    return all(getattr(a, k) == getattr(b, k) for k in keys)


# The one the process owns; the facade and inference.deployment call it through these names.
_process = EmbeddedService()
current_config = _process.current_config
remote_socket = _process.remote_socket
start = _process.start
stop = _process.stop
forget_inherited_service = _process.forget_inherited_service
on_service_loop = _process.on_service_loop
local_service = _process.local_service
built_service = _process.built_service
begin_warm_start = _process.begin_warm_start
warm_start_status = _process.warm_start_status
