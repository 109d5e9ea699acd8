"""FACADE: the only module (with ``inference.contracts``) that ``webapp`` imports.

It talks to an in-process inference service in the embedded default, and to the co-located
service process (``python -m inference serve``) over a local socket when ``PARLEY_INFERENCE_URL``
is set. Either way the web tier never imports torch.

The signatures below are the contract between the web tier and the inference service.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol

from inference.config import InferenceConfig
from inference.contracts import ParleyError, SessionEvent, SessionRequest, VoiceRef, WorkerSnapshot
from inference.registry import admission_stopped_error
from inference.status import ServiceStatus, SessionStatus

if TYPE_CHECKING:  # the web tier imports this module: it loads the service and engines only when it runs them
    from inference.engines.base import Engine


class SessionHandle(Protocol):
    """One attachment (one WebSocket) to a user's persistent session.

    Methods raise ``ParleyError`` with the protocol code on bad input; the session goes on.
    """

    @property
    def session_id(self) -> str | None: ...  # None while queued

    def events(self) -> AsyncIterator[SessionEvent]:
        """Queued* -> Ready -> (Prefill | AudioOut | TextOut | Decision | Metrics | ...)* -> Closed | Replaced."""
        ...

    async def update(
        self, *, persona: str | None = None, voice: VoiceRef | None = None, record: bool | None = None
    ) -> None:
        """Set persona / voice / the wish to be recorded; raises persona_update_unsupported /
        voice_update_unsupported / record_update_unsupported on a change after audio began."""

    async def append_audio(self, data: bytes, *, encoding: Literal["pcm16", "f32"], rate: int) -> None:
        """Raw little-endian samples of any length; reframed and resampled to the engine's chunk.

        Raises invalid_audio (odd byte count, NaN/Inf), unsupported_audio_format, session_not_ready,
        input_backpressure.
        """

    async def append_image(self, data: bytes) -> None:
        """One JPEG/PNG camera frame; unsupported_input on engines without video."""

    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def cancel(self) -> None:
        """Barge-in: advance the epoch; queued audio of the old epoch is dropped."""

    async def force_listen(self) -> None: ...
    async def playback_ack(self, played_ms: float) -> None: ...

    async def close(self, reason: str = "client_close") -> None:
        """End the session now; the slot is freed once the engine confirms cleanup."""

    async def detach(self) -> None:
        """The socket dropped: keep the session paused for disconnect_grace_s, then close it."""


# ---- the service behind the facade ----------------------------------------------------------------
# In-process mode keeps one InferenceService per process. It is bound to the event loop it started
# on; a call from another loop (pytest-asyncio gives each test its own) restarts it there, reusing
# the already warmed-up engine.

_config: InferenceConfig | None = None
_service = None  # inference.service.InferenceService, imported lazily
_starting: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None


def _current_config() -> InferenceConfig:
    global _config
    if _config is None:
        _config = InferenceConfig.from_env()
    return _config


def _remote_socket() -> str | None:
    config = _current_config()
    return config.socket_path if config.inference_url else None


async def start(*, engine_instance: Engine | None = None, **overrides: Any) -> None:
    """(Re)start the in-process service on the running loop, with config overrides.

    Args:
        engine_instance: serve this engine object instead of building one from the config (tests).
        **overrides: ``InferenceConfig`` fields, e.g. ``engine="echo", slots=1, queue_max=1``.
    """
    global _config, _service
    from inference.service import InferenceService

    await shutdown()
    config = InferenceConfig.from_env().with_overrides(**overrides)
    _config = config
    if config.inference_url:
        return  # remote mode: the service process owns its own configuration
    service = InferenceService(config, engine_instance)
    await service.start()
    _service = service


def _foreign_loop() -> asyncio.AbstractEventLoop | None:
    """The loop the in-process service runs on, when that loop is alive in another thread."""
    if _service is None or not _service.started or _service.usable_here:
        return None
    loop = _service.loop
    return loop if loop is not None and loop.is_running() and not loop.is_closed() else None


async def _on_service_loop(make_call):
    """Run ``make_call(service)`` on the service's own loop (a sync view's async_to_sync runs elsewhere)."""
    foreign = _foreign_loop()
    if foreign is None:
        return make_call(await _local_service())

    async def call():
        return make_call(_service)

    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), foreign))


async def _local_service():
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
        if _same_engine_config(old.config, _current_config()):
            engine, warmed = old.engine, old.warmed
    try:
        service = InferenceService(_current_config(), engine, warmed=warmed)
        await service.start()
    except Exception as exc:
        raise _engine_failure(exc) from exc
    _service = service
    return service


# Said to callers instead of the real error, whose message names server paths (checkpoints, devices).
ENGINE_UNAVAILABLE = "The inference engine is not available; the server log has the details."


def _engine_failure(exc: Exception) -> ParleyError:
    """Log why the engine could not be built or warmed up; the caller gets ENGINE_UNAVAILABLE only."""
    logging.getLogger(__name__).error(
        "inference.engine_load_failed: engine %r: %s", _current_config().engine, exc, exc_info=exc
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


async def open_session(request: SessionRequest) -> SessionHandle:
    """Attach to the user's session: takes over a live one, resumes a detached one, or queues for a slot.

    Raises ``ParleyError(code="resource_exhausted", error_type="rate_limit_error")`` when the queue is full
    or an admin stopped admitting new calls (``param="admission"``).
    """
    try:
        return await _open_session(request)
    except ParleyError as exc:
        if exc.code == "resource_exhausted":
            admissions_refused["admission_stopped" if exc.param == "admission" else "capacity"] += 1
        raise


async def _open_session(request: SessionRequest) -> SessionHandle:
    router = _router()
    if router is not None:
        return await router.open_session(request)
    socket_path = _remote_socket()
    if socket_path is not None:
        from inference.client import RemoteSessionHandle

        return await RemoteSessionHandle.open(socket_path, request)
    service = await _local_service()
    if request.user_key not in service.sessions:
        if not _admission_open:
            raise admission_stopped_error()
        if _draining:
            raise ParleyError(
                "the inference service is draining: it finishes its sessions and takes no new ones",
                code="resource_exhausted",
                error_type="server_error",
            )
    return await service.open_session(request)


# ---- several services, and the admin controls over them -----------------------------------------
# With PARLEY_REGISTRY_URL the web tier places sessions through the Redis registry (inference.routing);
# otherwise the one service (in-process or remote) is the whole cluster, under the id below.

IN_PROCESS_ID = "in-process"
admissions_refused: collections.Counter[str] = collections.Counter()  # reason -> count, for the metrics
_routing = None  # inference.routing.Router for the current config, built on first use
_admission_open = True  # without a registry the flags live here (one process); with one, in Redis
_draining = False
_local_history = None  # inference.status.History of the in-process service's statuses


def _router():
    global _routing
    config = _current_config()
    if not config.registry_url:
        return None
    if _routing is None or _routing.config is not config:
        from inference.routing import Router

        _routing = Router(config)
    return _routing


async def services() -> list[ServiceStatus]:
    """Every inference service with its sessions and queue: the registry's, or the one service's."""
    router = _router()
    if router is not None:
        return await router.services()
    socket_path = _remote_socket()
    if socket_path is not None:
        from inference.client import remote_status

        return [await remote_status(socket_path)]
    return [await _on_service_loop(_local_status)]


def status_metric_families(statuses: list[ServiceStatus]) -> Iterator[Any]:
    """Prometheus metric families of these statuses (``/ops/metrics``), as a service process exports its own."""
    from inference.exporter import status_families

    return status_families(statuses)


def _local_status(service) -> ServiceStatus:
    global _local_history
    from inference.status import History, service_status

    if _local_history is None:
        _local_history = History()
    state = "draining" if _draining else "serving"
    return service_status(service, service_id=IN_PROCESS_ID, address=IN_PROCESS_ID, state=state, history=_local_history)


async def set_draining(service_id: str, draining: bool) -> bool:
    """Admin: stop (or resume) placing new sessions on a service; its current sessions go on. False if unknown."""
    router = _router()
    if router is not None:
        return await router.set_draining(service_id, draining)
    global _draining
    if service_id != IN_PROCESS_ID or _remote_socket() is not None:
        return False
    _draining = draining
    return True


async def set_admission(open_: bool) -> None:
    """Admin: stop (or resume) admitting new calls everywhere; live and detached sessions go on."""
    global _admission_open
    router = _router()
    if router is not None:
        await router.set_admission(open_)
    else:
        _admission_open = open_


async def admission_open() -> bool:
    router = _router()
    return await router.admission_open() if router is not None else _admission_open


async def occupancy() -> list[WorkerSnapshot]:
    """Per-worker slot states and tick timings for the operations view."""
    router = _router()
    if router is not None:
        from inference.client import remote_occupancy

        live = [s for s in await router.services() if s.state != "down"]
        return [snapshot for s in live for snapshot in await remote_occupancy(s.address)]
    socket_path = _remote_socket()
    if socket_path is not None:
        from inference.client import remote_occupancy

        return await remote_occupancy(socket_path)
    return await _on_service_loop(lambda service: service.occupancy())


async def end_session(session_id: str, reason: str = "admin_ended") -> bool:
    """Admin: end a session by id. Returns False if it does not exist."""
    router = _router()
    if router is not None:
        return await router.end_session(session_id, reason)
    socket_path = _remote_socket()
    if socket_path is not None:
        from inference.client import remote_end_session

        return await remote_end_session(socket_path, session_id, reason)
    return await _on_service_loop(lambda service: service.end_session(session_id, reason))


def capabilities_preview() -> dict:
    """The default engine's capabilities as a plain dict (for pages rendered before a call)."""
    global _service
    config = _current_config()
    if config.registry_url:
        from inference.registry import capabilities_now

        preview = capabilities_now(config.registry_url, config.heartbeat_timeout_s)
        if preview is None:
            raise ParleyError("no inference service is serving", code="internal_error", error_type="server_error")
        return preview
    socket_path = _remote_socket()
    if socket_path is not None:
        from inference.client import remote_capabilities

        caps = remote_capabilities(socket_path)
    else:
        if _service is None:
            from inference.service import InferenceService

            try:
                _service = InferenceService(_current_config())  # built, not started: the first call reuses its engine
            except Exception as exc:
                raise _engine_failure(exc) from exc
        caps = _service.capabilities
    preview = dataclasses.asdict(caps)
    preview["extra"] = dict(caps.extra)
    return preview


async def shutdown() -> None:
    """Stop the in-process service, if one runs (tests, process exit); the next call re-reads the env."""
    global _service, _config, _routing, _admission_open, _draining, _local_history
    service, _service, _config = _service, None, None
    router, _routing, _admission_open, _draining, _local_history = _routing, None, True, False, None
    if router is not None:
        await router.stop()
    if service is None:
        return
    if service.usable_here:
        await service.stop()
    else:
        service.stop_worker()


# ---- voices: clips -> prompts (the web tier's voice task and importvoices call these) -----------------
# Decoding and cleaning need no torch; computing a prompt loads the engine's own codec or encoder here, in
# the calling process (the Celery worker, or the web process when the task runs eagerly).


def prepare_voice_clip(data: bytes, *, progress=None, min_speech_s: float | None = None):
    """Decode, trim, normalise and validate a voice clip (``inference.voice_prompts.prepare_clip``).

    Returns a ``PreparedClip`` (``wav`` bytes, ``speech_s``); raises ``ParleyError`` subclass ``VoiceClipError``
    whose ``code`` names the problem (empty, too_big, not_audio, corrupted, truncated, no_audio_track, too_long,
    too_short, silent, clipped).
    """
    from inference.voice_prompts import MIN_SPEECH_S, prepare_clip

    return prepare_clip(data, progress=progress, min_speech_s=MIN_SPEECH_S if min_speech_s is None else min_speech_s)


def voice_prompt_targets() -> list:
    """The voice prompts the configured engine can use (``PromptTarget``: family, model_key); [] for echo."""
    from inference.voice_prompts import prompt_targets

    config = _current_config()
    return prompt_targets(config.engine, config.checkpoint)


def compute_voice_prompt(wav_path, target, *, progress=None) -> bytes:
    """One target's prompt for a prepared clip's wav, as safetensors bytes (Mimi codes, or an embedding)."""
    from inference.voice_prompts import compute_prompt

    return compute_prompt(wav_path, target, progress)


def convert_voice_prompt_pt(data: bytes) -> bytes:
    """A PersonaPlex voice ``.pt`` as safetensors (loaded with ``weights_only=True``; ``VoiceClipError`` if not one)."""
    from inference.voice_prompts import convert_pt_prompt

    return convert_pt_prompt(data)


def voice_limits() -> dict[str, float]:
    """Upload and clip limits, for the web tier to check before reading a body and to show on its pages."""
    from inference import voice_prompts as v

    return {"max_bytes": v.MAX_UPLOAD_BYTES, "max_input_s": v.MAX_INPUT_S, "min_speech_s": v.MIN_SPEECH_S,
            "max_speech_s": v.MAX_SPEECH_S}  # fmt: skip


# ---- recordings (written by the service's recorder, read by the web tier's post-processing) ------------
# The service process and the web tier share the folder (PARLEY_RECORDINGS_DIR): same host, same path.


def _raw_folder(session_id: str):
    from inference.recording.chunks import session_folder

    return session_folder(_current_config().recordings_dir, session_id)


def raw_recording_state(session_id: str) -> Literal["missing", "open", "finished"]:
    """``finished`` once the session ended (or its killed service was restarted), ``open`` while it runs."""
    from inference.recording.chunks import folder_state

    return folder_state(_raw_folder(session_id))


def read_recording(session_id: str):
    """The decoded raw recording (``inference.recording.reader.RawRecording``).

    Raises ``ParleyError(code="recording_unreadable")`` naming what is wrong when nothing is usable.
    """
    from inference.recording import reader

    try:
        return reader.read_recording(_raw_folder(session_id))
    except reader.RawRecordingError as exc:
        raise ParleyError(str(exc), code="recording_unreadable", error_type="server_error") from exc


def raw_recording_size(session_id: str) -> int:
    from inference.recording.chunks import folder_size

    return folder_size(_raw_folder(session_id))


def delete_raw_recording(session_id: str) -> None:
    """Remove the raw chunks (after they were processed, or with the recording)."""
    import shutil

    shutil.rmtree(_raw_folder(session_id), ignore_errors=True)


__all__ = [
    "IN_PROCESS_ID",
    "ParleyError",
    "ServiceStatus",
    "SessionHandle",
    "SessionStatus",
    "admission_open",
    "admissions_refused",
    "capabilities_preview",
    "compute_voice_prompt",
    "convert_voice_prompt_pt",
    "end_session",
    "occupancy",
    "open_session",
    "raw_recording_size",
    "raw_recording_state",
    "read_recording",
    "delete_raw_recording",
    "prepare_voice_clip",
    "services",
    "set_admission",
    "set_draining",
    "shutdown",
    "start",
    "voice_limits",
    "voice_prompt_targets",
]
