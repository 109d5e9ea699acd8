"""Celery tasks: post-process a finished recording, sweep for ones nobody processed, purge old ones.

``process_recording`` never leaves a row half-made: it ends ``ready``, ``partial``, ``interrupted``
or ``failed`` (with the reason), or goes back to ``recording`` when the session has not ended yet.
Storage faults are retried with exponential backoff; the raw chunks are deleted only once the
files are stored, so a later run (the sweep, or a retry) can still succeed.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from inference import api
from inference.contracts import ParleyError
from webapp.recordings import storage
from webapp.recordings.caller_transcript import with_caller_lines
from webapp.recordings.echo_leak import echo_of_call
from webapp.recordings.models import Recording
from webapp.recordings.render import Rendered, render, stereo_tracks
from webapp.recordings.turn_taking import measure
from webapp.recordings.video import with_video

logger = logging.getLogger(__name__)

STORAGE_RETRIES = 4
BACKOFF_BASE_S = 5  # 5, 10, 20, 40 s between attempts
EAGER_BACKOFF_S = 0.1  # embedded default (eager, inline): 0.1, 0.2, 0.4, 0.8 s
END_WAIT_S = 5.0  # the writer thread writes end.json a moment after the session closed
STUCK_PROCESSING = timedelta(minutes=15)  # a worker that died mid-task left the row like this
Status = Recording.Status
STAGES = {"turn_taking": "measuring turn-taking", "echo_leak": "measuring the echo"}  # the analyses, in words


@shared_task(bind=True, acks_late=True)
def process_recording(self, recording_id: int, attempt: int = 0) -> str:
    """Render and store one recording; returns its final status (or why nothing was done).

    ``attempt`` counts storage failures so far; each one schedules the next run after a backoff
    (a plain new task rather than ``self.retry``, whose eager form raises instead of retrying).
    """
    recording = Recording.objects.filter(pk=recording_id).first()
    if recording is None:
        return "deleted"
    if recording.status not in (Status.RECORDING, Status.PROCESSING, Status.FAILED):
        return recording.status  # already done by an earlier run
    state = _wait_for_end(recording.session_id)
    if state == "missing":
        return _finish(recording, Status.FAILED, "the raw recording is missing (never written, or already removed)")
    if state == "open":
        Recording.objects.filter(pk=recording.pk).update(status=Status.RECORDING)
        return "still recording"  # the sweep picks it up once the service ends it
    _update(recording, status=Status.PROCESSING, progress=0.02, status_reason="", stage="reading the raw recording")
    try:
        raw = api.read_recording(recording.session_id)
    except ParleyError as exc:
        return _finish(recording, Status.FAILED, without_paths(exc.message))
    _copy_meta(recording, raw)
    _update(recording, stage="rendering the audio")
    try:
        rendered = render(raw, progress=lambda f: _update(recording, progress=round(0.05 + 0.55 * f, 3)))
    except Exception as exc:  # noqa: BLE001 - bad data must end as failed, never as a stuck row
        logger.exception("recordings.render_failed", extra={"session_id": recording.session_id})
        return _finish(recording, Status.FAILED, f"could not render the recording: {_describe(exc)}")
    rendered = with_video(raw, _with_caller_transcript(recording, raw, rendered))
    try:
        _update(recording, stage="storing the files")
        _store(recording, rendered)
    except Exception as exc:  # noqa: BLE001 - any storage fault (disk full, bucket unreachable) is retried
        # The whole fault (paths included) for the operator; the reason users see names none (_describe).
        logger.warning("recordings.store_failed", exc_info=True, extra={"session_id": recording.session_id})
        recording.attempts += 1
        if attempt < STORAGE_RETRIES:
            countdown = BACKOFF_BASE_S * 2**attempt
            _update(
                recording,
                attempts=recording.attempts,
                status_reason=f"storing failed ({_describe(exc)}); retry {attempt + 1} in {countdown} s",
            )
            if self.request.is_eager:  # no broker to hold the retry: wait here, briefly
                time.sleep(EAGER_BACKOFF_S * 2**attempt)
            process_recording.apply_async((recording_id, attempt + 1), countdown=countdown)
            return "retrying"
        return _finish(
            recording,
            Status.FAILED,
            f"storing failed after {recording.attempts} attempts: {_describe(exc)}; the raw recording is kept",
            attempts=recording.attempts,
        )
    status, reason = _outcome(raw)
    _finish(
        recording,
        status,
        reason,
        duration_s=round(rendered.duration_s, 3),
        transcript_text=rendered.transcript_text,
        **_measures(recording, raw),
    )
    api.delete_raw_recording(recording.session_id)
    return status


@shared_task
def sweep_recordings() -> int:
    """Beat: process recordings whose session ended without anyone asking (a kill, a lost task)."""
    started = 0
    for recording in Recording.objects.filter(status=Status.RECORDING).only("pk", "session_id"):
        if api.raw_recording_state(recording.session_id) == "finished":
            process_recording.delay(recording.pk)
            started += 1
    stuck = Recording.objects.filter(status=Status.PROCESSING, updated_at__lt=timezone.now() - STUCK_PROCESSING)
    for recording in stuck.only("pk"):
        process_recording.delay(recording.pk)
        started += 1
    return started


@shared_task
def purge_recordings() -> int:
    """Beat: delete recordings older than ``PARLEY_RECORDING_RETENTION_DAYS`` (0 keeps them forever)."""
    from webapp.recordings.services import recording_delete

    days = settings.PARLEY_RECORDING_RETENTION_DAYS
    if days <= 0:
        return 0
    old = Recording.objects.filter(started_at__lt=timezone.now() - timedelta(days=days))
    purged = 0
    for recording in old.exclude(status__in=(Status.RECORDING, Status.PROCESSING)):
        recording_delete(recording)
        purged += 1
    return purged + purge_expired_exports(days=days)


def _wait_for_end(session_id: str) -> str:
    deadline = time.monotonic() + END_WAIT_S
    while True:
        state = api.raw_recording_state(session_id)
        if state != "open" or time.monotonic() >= deadline:
            return state
        time.sleep(0.2)


def _with_caller_transcript(recording: Recording, raw, rendered: Rendered) -> Rendered:
    """The caller's words merged into the transcript; a transcriber fault leaves the agent's side alone."""
    if settings.PARLEY_TRANSCRIBER != "off":
        _update(recording, stage="transcribing the caller")
    try:
        words = api.transcribe_speech(
            raw.caller,
            raw.caller_rate,
            engine=settings.PARLEY_TRANSCRIBER,
            whisper_weights=settings.PARLEY_WHISPER_WEIGHTS,
        )
    except Exception:  # noqa: BLE001 - the caller's transcript is extra: it must never cost the recording
        logger.warning("recordings.transcription_failed", exc_info=True, extra={"session_id": recording.session_id})
        return rendered
    return rendered if words is None else with_caller_lines(rendered, words)


def _measures(recording: Recording, raw) -> dict[str, dict]:
    """The call's turn-taking and echo-leak measures (model fields); one that fails keeps its reason instead,
    and the recording still plays."""
    stereo, rate = stereo_tracks(raw)
    analyses = {
        "turn_taking": lambda: measure(stereo[:, 0], stereo[:, 1], rate, events=raw.events, step_time=raw.step_time),
        "echo_leak": lambda: echo_of_call(raw.events, stereo[:, 0], stereo[:, 1], rate),
    }
    results = {}
    for field, analyse in analyses.items():
        _update(recording, stage=STAGES[field])
        try:
            results[field] = analyse()
        except Exception as exc:  # noqa: BLE001 - analysis is extra: it must never cost the recording
            logger.warning(f"recordings.{field}_failed", exc_info=True, extra={"session_id": recording.session_id})
            results[field] = {"error": _describe(exc)}
    return results


def _copy_meta(recording: Recording, raw) -> None:
    meta = raw.meta
    fields = {
        "checkpoint": str(meta.get("checkpoint") or "")[:500],
        "raw_bytes": api.raw_recording_size(recording.session_id),
    }
    if not recording.voice and meta.get("voice"):
        fields["voice"] = str(meta["voice"])[:200]
    end = raw.end or {}
    if recording.ended_at is None and isinstance(end.get("ended_at"), int | float):
        # Nobody saw the end (a grace expiry, a kill): the service's end marker says when and why.
        fields["ended_at"] = datetime.fromtimestamp(end["ended_at"], tz=UTC)
        fields["close_reason"] = str(end.get("reason", ""))[:30]
    _update(recording, **fields)


def _store(recording: Recording, rendered: Rendered) -> None:
    names: dict[str, str] = {}
    total = 0
    for i, (kind, (filename, content)) in enumerate(rendered.files.items()):
        name = storage.file_name(user_id=recording.user_id, session_id=recording.session_id, filename=filename)
        names[kind] = storage.save(name, content)
        total += len(content)
        _update(recording, progress=round(0.6 + 0.38 * (i + 1) / len(rendered.files), 3))
    _update(recording, files=names, stored_bytes=total)


def _outcome(raw) -> tuple[str, str]:
    if raw.interrupted:
        note = "the inference service stopped mid-call; the audio up to then was kept"
        return Status.INTERRUPTED, note + (f" ({'; '.join(raw.problems)})" if raw.problems else "")
    if raw.problems:
        return Status.PARTIAL, "; ".join(raw.problems)
    return Status.READY, ""


def _finish(recording: Recording, status: str, reason: str, **fields) -> str:
    _update(
        recording,
        status=status,
        status_reason=reason,
        stage="",
        progress=1.0 if status != Status.FAILED else recording.progress,
        **fields,
    )
    log = logger.warning if status in (Status.FAILED, Status.PARTIAL) else logger.info
    log("recordings.processed", extra={"session_id": recording.session_id, "status": status, "reason": reason})
    return status


def _update(recording: Recording, **fields) -> None:
    for name, value in fields.items():
        setattr(recording, name, value)
    Recording.objects.filter(pk=recording.pk).update(**fields, updated_at=timezone.now())


def _describe(exc: BaseException) -> str:
    """The fault as users may read it: its kind and message, never a server path (the log has the rest)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"  # "[Errno 20] Not a directory: '/srv/...'" without the file
    return without_paths(f"{type(exc).__name__}: {exc}")[:300]


# An absolute filesystem path: "/" not part of a URL or a word ("http://host/x", "a/b" are left alone).
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/[^\s'\"]+")


def without_paths(text: str) -> str:
    """``text`` with every absolute filesystem path replaced by its last component."""
    return _ABSOLUTE_PATH.sub(lambda m: "…/" + m.group(0).rstrip("/").rsplit("/", 1)[-1], text)


# The export task lives with the export; importing it here registers it with the worker (autodiscovery reads tasks.py).
from webapp.recordings.export_tasks import export_evaluation_set, purge_expired_exports  # noqa: E402, F401
