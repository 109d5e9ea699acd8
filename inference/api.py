"""FACADE: the only module (with ``inference.contracts``) that ``webapp`` imports.

It talks to an in-process inference service in the embedded default, and to the co-located
service process (``python -m inference serve``) over a local socket when ``PARLEY_INFERENCE_URL``
is set (``inference.embedded`` holds that service and the configuration). Either way the web tier never
imports torch. The facade holds no state of its own: it delegates to the ``inference.deployment.Deployment``
this process owns (routing, admission and draining, statuses), to ``inference.recording.raw_store`` for raw
recordings and to ``inference.voice_prompts`` for voice prompts.

The signatures below are the contract between the web tier and the inference service.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from inference import embedded
from inference.audio.quiet_gaps import QUIET_RMS  # noqa: F401  (the web tier's WebRTC track trims by the same level)
from inference.contracts import (
    ParleyError,
    SessionRequest,
    VoiceRef,
    WorkerSnapshot,
)
from inference.deployment import IN_PROCESS_ID, Deployment
from inference.session_handle import SessionHandle  # noqa: F401  (the contract of a session's connection)
from inference.status import ServiceStatus, SessionStatus

if TYPE_CHECKING:  # the web tier imports this module: it loads the service and engines only when it runs them
    from inference.engines.base import Engine


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


def warm_start(*, persona: str | None, voice: VoiceRef | None = None) -> bool:
    """Start loading the in-process engine and preparing this start (persona, voice) in a background thread.

    Returns at once; False when there is nothing to do here (a remote service, or already begun in this
    process). The first session with this persona and voice then starts without a prefill.
    """
    return embedded.begin_warm_start(persona, voice)


def warm_start_status() -> dict[str, str]:
    """The warm start's ``state`` (``off``: none in this process, ``warming``, ``ready``, ``failed``) and its
    ``stage`` in words while warming."""
    return embedded.warm_start_status()


async def open_session(request: SessionRequest) -> SessionHandle:
    """Attach to the user's session: takes over a live one, resumes a detached one, or queues for a slot.

    Raises ``ParleyError(code="resource_exhausted", error_type="rate_limit_error")`` when the queue is full
    or an admin stopped admitting new calls (``param="admission"``).
    """
    return await _deployment.open_session(request)


# ---- several services, and the admin controls over them -----------------------------------------
# inference.deployment owns them: with PARLEY_REGISTRY_URL the web tier places sessions through the Redis
# registry; otherwise the one service (in-process or remote) is the whole cluster, under IN_PROCESS_ID.

_deployment = Deployment()  # this process's: routing, admission and draining flags, status history
admissions_refused = _deployment.admissions_refused  # reason -> count, for the metrics (kept across restarts)


async def services() -> list[ServiceStatus]:
    """Every inference service with its sessions and queue: the registry's, or the one service's."""
    return await _deployment.services()


def downloads() -> list[dict[str, Any]]:
    """This process's hub downloads (a ``PARLEY_CHECKPOINT`` hub id being fetched): repo, state ("downloading",
    "done", "failed"), bytes and files done of their totals. A service process logs its own (``hub.progress``)."""
    from inference.checkpoints.hub import DOWNLOADS

    return DOWNLOADS.snapshot()


def status_metric_families(statuses: list[ServiceStatus]) -> Iterator[Any]:
    """Prometheus metric families of these statuses (``/ops/metrics``), as a service process exports its own."""
    from inference.cluster.exporter import status_families

    return status_families(statuses)


async def set_draining(service_id: str, draining: bool) -> bool:
    """Admin: stop (or resume) placing new sessions on a service; its current sessions go on. False if unknown."""
    return await _deployment.set_draining(service_id, draining)


async def set_admission(open_: bool) -> None:
    """Admin: stop (or resume) admitting new calls everywhere; live and detached sessions go on."""
    await _deployment.set_admission(open_)


async def admission_open() -> bool:
    return await _deployment.admission_open()


async def occupancy() -> list[WorkerSnapshot]:
    """Per-worker slot states and tick timings for the operations view."""
    return await _deployment.occupancy()


async def end_session(session_id: str, reason: str = "admin_ended") -> bool:
    """Admin: end a session by id. Returns False if it does not exist."""
    return await _deployment.end_session(session_id, reason)


def capabilities_preview() -> dict:
    """The default engine's capabilities as a plain dict (for pages rendered before a call)."""
    return _deployment.capabilities_preview()


async def shutdown() -> None:
    """Stop the in-process service, if one runs (tests, process exit); the next call re-reads the env."""
    await _deployment.stop()
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


def measure_echo(caller, agent, rate: int) -> dict:
    """The agent's audio found in the caller's microphone over a whole recorded call (two tracks on one clock):
    ``{"flagged", "leak_db", "delay_ms", "correlation", "peak_sigmas"}`` (``inference.audio.echo_leak``).

    Raises:
        EchoLeakError (a ValueError): tracks that are not one channel each, a rate that is not positive.
    """
    from inference.audio.echo_leak import measure_echo as measure

    return measure(caller, agent, rate)


def voice_prompt_targets() -> list:
    """The voice prompts the configured engine can use (``PromptTarget``: family, model_key); [] for echo."""
    from inference.checkpoints.hub import HubError
    from inference.checkpoints.resolve import resolve_config
    from inference.voice_prompts import prompt_targets

    try:  # a hub id and engine "auto" name the same folder and family the engine serves
        config = resolve_config(embedded.current_config())
    except HubError as exc:
        raise ParleyError(f"cannot resolve the checkpoint: {exc}", code="internal_error") from exc
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


def _raw_recordings():
    from inference.recording.raw_store import RawRecordings

    return RawRecordings(embedded.current_config().recordings_dir)


def raw_recording_state(session_id: str) -> Literal["missing", "open", "finished"]:
    """``finished`` once the session ended (or its killed service was restarted), ``open`` while it runs."""
    return _raw_recordings().state(session_id)


def read_recording(session_id: str):
    """The decoded raw recording (``inference.recording.reader.RawRecording``).

    Raises ``ParleyError(code="recording_unreadable")`` naming what is wrong when nothing is usable.
    """
    return _raw_recordings().read(session_id)


def raw_recording_size(session_id: str) -> int:
    return _raw_recordings().size(session_id)


def delete_raw_recording(session_id: str) -> None:
    """Remove the raw chunks (after they were processed, or with the recording)."""
    _raw_recordings().delete(session_id)


# ---- replays: a recorded call's caller track run again on another configuration -------------------------


def recording_steps_file(raw) -> bytes:
    """What the engine got and gave, step by step, for a decoded raw recording (``read_recording``): the file a
    replay runs from, kept with the processed recording (``inference.recording.steps_file``)."""
    from inference.recording.steps_file import encode_steps

    return encode_steps(raw)


def recording_agent_tokens(steps_file: bytes) -> dict[int, tuple[int, ...]]:
    """The agent's tokens per step of a steps file ({} when the engine reported none)."""
    return _decode_steps(steps_file).agent_tokens


def _decode_steps(steps_file: bytes):
    from inference.recording.steps_file import StepsFileError, decode_steps

    try:
        return decode_steps(steps_file)
    except StepsFileError as exc:
        raise ParleyError(str(exc), code="recording_unreadable", error_type="server_error") from exc


def replay_call(
    steps_file: bytes,
    frames: dict[int, bytes],
    *,
    session_id: str,
    engine: str | None = None,
    checkpoint: str | None = None,
    persona: str | None = None,
    voice: VoiceRef | None = None,
    greedy: bool | None = None,
    pace: Literal["original", "fast"] = "fast",
    progress=None,
):
    """Run a call's caller track (its steps file, and its camera frames by step) again, into the raw recording
    ``session_id`` under ``PARLEY_RECORDINGS_DIR`` (post-processed like a call). None keeps the source's value;
    ``pace="original"`` keeps the caller's timing, ``"fast"`` goes as fast as the engine. Returns
    ``inference.replay.ReplayOutcome``; raises ``ParleyError`` (recording_unreadable, invalid_value,
    engine_failed)."""
    from inference.replay import ReplaySettings, run_replay

    calls = _decode_steps(steps_file)
    settings = ReplaySettings(engine=engine, checkpoint=checkpoint, persona=persona, voice=voice, greedy=greedy,
                              pace=pace)  # fmt: skip
    config = embedded.current_config()
    return run_replay(calls, frames, session_id=session_id, settings=settings, base=config,
                      recordings_dir=config.recordings_dir, progress=progress)  # fmt: skip


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
    "recording_agent_tokens",
    "recording_steps_file",
    "replay_call",
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
