"""The in-process inference service behind the facade, and the configuration the facade reads.

``inference.api`` offers the calls; this module owns which service answers them in this process. In
the embedded default that is one ``InferenceService`` per process. It is bound to the event loop it
started on; a call from another loop (pytest-asyncio gives each test its own) restarts it there,
reusing the already warmed-up engine. With ``PARLEY_INFERENCE_URL`` set, the service is another
process and only the configuration lives here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from inference.config import InferenceConfig
from inference.contracts import ParleyError

if TYPE_CHECKING:  # the web tier imports the facade: it loads the service and engines only when it runs them
    from inference.engines.base import Engine

_config: InferenceConfig | None = None
_service = None  # inference.service.InferenceService, imported lazily
_starting: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None

# Said to callers instead of the real error, whose message names server paths (checkpoints, devices).
ENGINE_UNAVAILABLE = "The inference engine is not available; the server log has the details."


def current_config() -> InferenceConfig:
    """The configuration from the environment (read once), or the one ``start`` was given."""
    global _config
    if _config is None:
        _config = InferenceConfig.from_env()
    return _config


def remote_socket() -> str | None:
    """The service process's socket in remote mode; None when the service runs in this process."""
    config = current_config()
    return config.socket_path if config.inference_url else None


async def start(engine_instance: Engine | None, overrides: dict[str, Any]) -> None:
    """Start the in-process service on the running loop with config overrides (after ``stop``)."""
    global _config, _service
    from inference.service import InferenceService

    config = InferenceConfig.from_env().with_overrides(**overrides)
    _config = config
    if config.inference_url:
        return  # remote mode: the service process owns its own configuration
    service = InferenceService(config, engine_instance)
    await service.start()
    _service = service


async def stop() -> None:
    """Stop the in-process service, if one runs; the next call re-reads the env."""
    global _service, _config
    service, _service, _config = _service, None, None
    if service is None:
        return
    if service.usable_here:
        await service.stop()
    else:
        service.stop_worker()


def forget_inherited_service() -> None:
    """Drop a service and configuration inherited through ``fork`` (a test's live server child).

    The parent's service belongs to the parent's threads and loop, and its configuration was read from
    the parent's environment; the child reads its own ``PARLEY_*`` on its first call instead.
    """
    global _service, _config, _starting
    _service, _config, _starting = None, None, None


def _foreign_loop() -> asyncio.AbstractEventLoop | None:
    """The loop the in-process service runs on, when that loop is alive in another thread."""
    if _service is None or not _service.started or _service.usable_here:
        return None
    loop = _service.loop
    return loop if loop is not None and loop.is_running() and not loop.is_closed() else None


async def on_service_loop(make_call):
    """Run ``make_call(service)`` on the service's own loop (a sync view's async_to_sync runs elsewhere)."""
    foreign = _foreign_loop()
    if foreign is None:
        return make_call(await local_service())

    async def call():
        return make_call(_service)

    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), foreign))


async def local_service():
    """The in-process service, started (or restarted) on the running loop.

    A service whose loop still runs in another thread is never restarted from here: that would end
    every live call. Sessions must be opened on the service's loop (the ASGI server's loop).
    """
    global _starting
    if _service is not None and _service.usable_here:
        return _service
    if _foreign_loop() is not None:
        raise ParleyError(
            "the in-process inference service runs on another event loop; open sessions from the ASGI "
            "server's loop, or run the service as a process (PARLEY_INFERENCE_URL)",
            code="internal_error",
            error_type="server_error",
        )
    loop = asyncio.get_running_loop()
    if _starting is None or _starting[0] is not loop:  # one start per loop, however many callers wait
        _starting = (loop, loop.create_task(_restart_here()))
    task = _starting[1]
    try:
        return await asyncio.shield(task)
    finally:
        if task.done() and _starting is not None and _starting[1] is task:
            _starting = None


async def _restart_here():
    global _service
    from inference.service import InferenceService

    old = _service
    engine, warmed = None, False
    if old is not None:
        old.stop_worker()  # its loop is gone or different; its sessions went with it
        if _same_engine_config(old.config, current_config()):
            engine, warmed = old.engine, old.warmed
    try:
        service = InferenceService(current_config(), engine, warmed=warmed)
        await service.start()
    except Exception as exc:
        raise _engine_failure(exc) from exc
    _service = service
    return service


def built_service():
    """The in-process service, built but not started if none exists yet (the first call reuses its engine)."""
    global _service
    if _service is None:
        from inference.service import InferenceService

        try:
            _service = InferenceService(current_config())
        except Exception as exc:
            raise _engine_failure(exc) from exc
    return _service


def _engine_failure(exc: Exception) -> ParleyError:
    """Log why the engine could not be built or warmed up; the caller gets ENGINE_UNAVAILABLE only."""
    logging.getLogger("inference.api").error(
        "inference.engine_load_failed: engine %r: %s", current_config().engine, exc, exc_info=exc
    )
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
