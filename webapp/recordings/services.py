"""Catalogue writes at a session's edges (called by the realtime consumer) and deletion.

Touched when a session becomes ready and when it closes, never per frame.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from inference import api
from webapp.personas.models import Persona
from webapp.recordings import storage
from webapp.recordings.models import Recording


def recording_start(
    *, user: AbstractBaseUser, session_id: str, engine: str, persona_id: int | None, voice: str | None
) -> Recording:
    """The catalogue row of a recorded session (idempotent: a resumed session keeps its row)."""
    persona = Persona.objects.filter(pk=persona_id).first() if persona_id is not None else None
    recording, _ = Recording.objects.get_or_create(
        session_id=session_id,
        defaults={
            "user": user,
            "engine": engine,
            "persona_id": persona_id,
            "persona_name": persona.name if persona is not None else "",
            # Set once personas are versioned (another app's field; read only if it exists).
            "persona_version": getattr(persona, "version", None),
            "voice": voice or "",
            "started_at": timezone.now(),
        },
    )
    return recording


def recording_close(*, session_id: str, reason: str) -> None:
    """The session ended: note when and why, and queue its post-processing once this commits."""
    from webapp.recordings.tasks import process_recording

    with transaction.atomic():
        recording = Recording.objects.select_for_update().filter(session_id=session_id).first()
        if recording is None or recording.ended_at is not None:
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
