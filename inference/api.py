"""FACADE: the only module (with ``inference.contracts``) that ``webapp`` imports.

It talks to an in-process inference service in the embedded default, and to the co-located
service process (``python -m inference serve``) over a local socket when ``PARLEY_INFERENCE_URL``
is set (``inference.embedded`` holds that service and the configuration). Either way the web tier never
imports torch.

The signatures below are the contract between the web tier and the inference service.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol

from inference import embedded
from inference.cluster.registry import admission_stopped_error
from inference.contracts import (
    ChatMessage,
    Mode,
    ParleyError,
    SessionEvent,
    SessionRequest,
    TurnDetection,
    VoiceRef,
    WorkerSnapshot,
)
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

    async def set_mode(
        self, *, mode: Mode | None, turn_detection: TurnDetection | None, max_response_s: int | None = None
    ) -> None:
        """Duplex, half-duplex or chat, and half-duplex's turn detection (None: the client commits turns).

        Raises unsupported_mode (the engine does not serve it), mode_update_unsupported (after audio
        began), invalid_value (settings out of range)."""

    async def commit_input(self) -> None:
        """Half-duplex: the caller's turn ends here (input_audio_buffer_commit_empty under 100 ms)."""

    async def clear_input(self) -> None: ...
    async def create_response(self) -> None:
        """Half-duplex: answer now; chat: answer the conversation, taking a slot (or queueing) until the reply
        ends. conversation_already_has_active_response while one runs."""

    async def add_chat_item(self, message: ChatMessage) -> None:
        """Chat: add a message to the conversation. unsupported_mode outside chat, message_too_large,
        invalid_image, invalid_audio, invalid_value (an empty message)."""

    async def close(self, reason: str = "client_close") -> None:
        """End the session now; the slot is freed once the engine confirms cleanup."""

    async def detach(self) -> None:
        """The socket dropped: keep the session paused for disconnect_grace_s, then close it."""


# ---- the service behind the facade ----------------------------------------------------------------
# inference.embedded owns it: the in-process service (bound to its event loop) and the configuration.

ENGINE_UNAVAILABLE = embedded.ENGINE_UNAVAILABLE


async def start(*, engine_instance: Engine | None = None, **overrides: Any) -> None:
    """(Re)start the in-process service on the running loop, with config overrides.

    Args:
        engine_instance: serve this engine object instead of building one from the config (tests).
        **overrides: ``InferenceConfig`` fields, e.g. ``engine="echo", slots=1, queue_max=1``.
    """
    await shutdown()
    await embedded.start(engine_instance, overrides)


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
    socket_path = embedded.remote_socket()
    if socket_path is not None:
        from inference.transport.client import RemoteSessionHandle

        return await RemoteSessionHandle.open(socket_path, request)
    service = await embedded.local_service()
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
# With PARLEY_REGISTRY_URL the web tier places sessions through the Redis registry (inference.cluster.routing);
# otherwise the one service (in-process or remote) is the whole cluster, under the id below.

IN_PROCESS_ID = "in-process"
admissions_refused: collections.Counter[str] = collections.Counter()  # reason -> count, for the metrics
_routing = None  # inference.cluster.routing.Router for the current config, built on first use
_admission_open = True  # without a registry the flags live here (one process); with one, in Redis
_draining = False
_local_history = None  # inference.status.History of the in-process service's statuses


def _router():
    global _routing
    config = embedded.current_config()
    if not config.registry_url:
        return None
    if _routing is None or _routing.config is not config:
        from inference.cluster.routing import Router

        _routing = Router(config)
    return _routing


async def services() -> list[ServiceStatus]:
    """Every inference service with its sessions and queue: the registry's, or the one service's."""
    router = _router()
    if router is not None:
        return await router.services()
    socket_path = embedded.remote_socket()
    if socket_path is not None:
        from inference.transport.client import remote_status

        return [await remote_status(socket_path)]
    return [await embedded.on_service_loop(_local_status)]


def status_metric_families(statuses: list[ServiceStatus]) -> Iterator[Any]:
    """Prometheus metric families of these statuses (``/ops/metrics``), as a service process exports its own."""
    from inference.cluster.exporter import status_families

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
    if service_id != IN_PROCESS_ID or embedded.remote_socket() is not None:
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
        from inference.transport.client import remote_occupancy

        live = [s for s in await router.services() if s.state != "down"]
        return [snapshot for s in live for snapshot in await remote_occupancy(s.address)]
    socket_path = embedded.remote_socket()
    if socket_path is not None:
        from inference.transport.client import remote_occupancy

        return await remote_occupancy(socket_path)
    return await embedded.on_service_loop(lambda service: service.occupancy())


async def end_session(session_id: str, reason: str = "admin_ended") -> bool:
    """Admin: end a session by id. Returns False if it does not exist."""
    router = _router()
    if router is not None:
        return await router.end_session(session_id, reason)
    socket_path = embedded.remote_socket()
    if socket_path is not None:
        from inference.transport.client import remote_end_session

        return await remote_end_session(socket_path, session_id, reason)
    return await embedded.on_service_loop(lambda service: service.end_session(session_id, reason))


def capabilities_preview() -> dict:
    """The default engine's capabilities as a plain dict (for pages rendered before a call)."""
    config = embedded.current_config()
    if config.registry_url:
        from inference.cluster.registry import capabilities_now

        preview = capabilities_now(config.registry_url, config.heartbeat_timeout_s)
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


async def shutdown() -> None:
    """Stop the in-process service, if one runs (tests, process exit); the next call re-reads the env."""
    global _routing, _admission_open, _draining, _local_history
    router, _routing, _admission_open, _draining, _local_history = _routing, None, True, False, None
    if router is not None:
        await router.stop()
    await embedded.stop()


# ---- voices: clips -> prompts (the web tier's voice task and importvoices call these) -----------------
# Decoding and cleaning need no torch and run in a limited child process (``clip_sandbox``); computing a
# prompt loads the engine's own codec or encoder here, in the calling process (the Celery worker, or the web
# process when the task runs eagerly).


def probe_voice_clip(data: bytes):
    """What an uploaded clip's container header declares (``inference.media_probe.MediaHeader``: format, codec,
    rate, channels, declared seconds, and the ``extension`` to store it with), each checked against its cap.
    Decodes nothing: cheap enough for the web request, before anything is stored.

    Raises:
        VoiceClipError (a ParleyError): ``empty``, ``not_audio``, ``corrupted``, ``unsupported_codec``,
        ``no_audio_track``, ``too_long`` or ``too_demanding``.
    """
    from inference.media_probe import probe
    from inference.voice_prompts import MAX_INPUT_S

    return probe(data, max_seconds=MAX_INPUT_S)


def prepare_voice_clip(data: bytes, *, progress=None, min_speech_s: float | None = None):
    """Decode, trim, normalise and validate a voice clip (``inference.voice_prompts.prepare_clip``) in a child
    process under memory, CPU and wall-clock limits (``inference.clip_sandbox``).

    Returns a ``PreparedClip`` (``wav`` bytes, ``speech_s``); raises ``ParleyError`` subclass ``VoiceClipError``
    whose ``code`` names the problem (empty, too_big, not_audio, corrupted, unsupported_codec, too_demanding,
    truncated, no_audio_track, too_long, too_short, silent, clipped).
    """
    from inference.clip_sandbox import prepare_clip_in_child
    from inference.voice_prompts import MIN_SPEECH_S

    return prepare_clip_in_child(
        data, progress=progress, min_speech_s=MIN_SPEECH_S if min_speech_s is None else min_speech_s
    )


def require_spoken_phrase(prepared, phrase: str) -> None:
    """Raise unless ``phrase`` is spoken in a clip ``prepare_voice_clip`` returned (keyword spotting,
    ``inference.speech.phrase_spotting``: PocketSphinx's bundled English model, nothing downloaded).

    Raises:
        VoiceClipError (a ParleyError): ``phrase_not_heard``, or ``phrase_unknown`` (a word the model lacks).
    """
    from inference.speech.phrase_spotting import require_phrase
    from inference.voice_prompts import SAMPLE_RATE

    require_phrase(prepared.pcm, SAMPLE_RATE, phrase)


def transcribe_speech(pcm, rate: int, *, engine: str = "auto", whisper_weights: str = "") -> list | None:
    """The words spoken in ``pcm`` with their times (``inference.speech.transcribe.Word``), by the engine
    configuration picks: PocketSphinx (embedded, nothing downloaded), Whisper when ``whisper_weights`` names
    its weights; None when ``engine`` is "off".

    Raises:
        TranscriptionError (a ParleyError): an unknown engine, weights that do not load, unusable audio.
    """
    from inference.speech.transcribe import transcriber_for

    transcriber = transcriber_for(engine, whisper_weights=whisper_weights)
    return None if transcriber is None else transcriber.transcribe(pcm, rate)


def voice_prompt_targets() -> list:
    """The voice prompts the configured engine can use (``PromptTarget``: family, model_key); [] for echo."""
    from inference.voice_prompts import prompt_targets

    config = embedded.current_config()
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

    return session_folder(embedded.current_config().recordings_dir, session_id)


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
    "probe_voice_clip",
    "services",
    "set_admission",
    "set_draining",
    "shutdown",
    "start",
    "voice_limits",
    "voice_prompt_targets",
]
