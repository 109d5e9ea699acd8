"""Catalogue writes at a session's edges (called by the realtime consumer) and deletion.

Touched when a session becomes ready and when it closes, never per frame.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from inference import api
from inference.contracts import EngineCapabilities
from webapp.personas.models import Persona
from webapp.recordings import storage
from webapp.recordings.models import Recording


def record_effective(capabilities: EngineCapabilities | None, requested: bool) -> bool:
    """Whether a session is recorded: the deployment's policy (``capabilities.extra.record_policy``)
    forces it on or off, ``auto`` follows the caller's ``session.duplex.record``."""
    policy = capabilities.extra.get("record_policy", "auto") if capabilities is not None else "auto"
    return {"on": True, "off": False}.get(policy, requested)


def recording_sync(
    *,
    user: AbstractBaseUser,
    session_id: str | None,
    recorded: bool,
    engine: str,
    persona_id: int | None,
    persona_version: int | None,
    voice: str | None,
    mode: str = "duplex",
) -> None:
    """Keep the catalogue in step with the session: a row while it is recorded, none once it is not.

    Called when the session becomes ready and when ``session.duplex.record`` changes (before audio:
    the service refuses a change after). Idempotent: a resumed session keeps its row.
    """
    if not session_id:
        return
    if not recorded:
        Recording.objects.filter(session_id=session_id, status=Recording.Status.RECORDING, ended_at=None).delete()
        return
    persona = Persona.objects.filter(pk=persona_id).first() if persona_id is not None else None
    row, created = Recording.objects.get_or_create(
        session_id=session_id,
        defaults={
            "user": user,
            "engine": engine,
            "mode": mode,
            "persona_id": persona_id,
            "persona_name": persona.name if persona is not None else "",
            "persona_version": persona_version,
            "voice": voice or "",
            "started_at": timezone.now(),
        },
    )
    if created or row.ended_at is not None:
        return
    # The row is made when the session is ready; the mode, persona and voice are chosen by session.update after.
    chosen = {
        "mode": mode,
        "persona_id": persona_id,
        "persona_name": persona.name if persona is not None else "",
        "persona_version": persona_version,
        "voice": voice or "",
    }
    changed = {name: value for name, value in chosen.items() if getattr(row, name) != value}
    if changed:
        Recording.objects.filter(pk=row.pk).update(**changed)


def recording_close(*, session_id: str, reason: str, nothing_recorded: bool = False) -> None:
    """The session ended: note when and why, and queue its post-processing once this commits.

    ``nothing_recorded``: it ended before its recording began (a call with no audio, a chat with no message):
    its row goes, instead of a recording that post-processing would fail as missing.
    """
    from webapp.recordings.tasks import process_recording

    with transaction.atomic():
        recording = Recording.objects.select_for_update().filter(session_id=session_id).first()
        if recording is None or recording.ended_at is not None:
            return
        if nothing_recorded:
            recording.delete()
            return
        recording.ended_at = timezone.now()
        recording.close_reason = reason[:30]
        recording.save(update_fields=["ended_at", "close_reason", "updated_at"])
        transaction.on_commit(lambda: process_recording.delay(recording.pk))


def recording_delete(recording: Recording) -> None:
    """Delete the row, its stored files and any raw chunks left behind."""
    storage.delete_all(list(recording.files.values()))
    api.delete_raw_recording(recording.session_id)
    recording.delete()


_closing: set[asyncio.Task] = set()  # strong references: a task nobody holds may be collected mid-run


def session_closed(*, session_id: str, reason: str, nothing_recorded: bool = False) -> None:
    """The consumer's loop saw the session end: record it and queue post-processing.

    Runs as its own task, outside the socket's pump, so a client that hangs up on ``session.closed``
    cannot cancel it half-way; and off the thread-sensitive executor, so an eager (inline)
    post-processing run does not hold up every other consumer's database calls.
    """
    task = asyncio.get_running_loop().create_task(
        sync_to_async(recording_close, thread_sensitive=False)(
            session_id=session_id, reason=reason, nothing_recorded=nothing_recorded
        )
    )
    _closing.add(task)
    task.add_done_callback(_closing.discard)
