"""Replay a recorded call against another configuration: a Celery job whose result is a recording of its own.

``replay_start`` makes the new row (linked to its source, naming what changed) and queues ``replay_recording``,
which runs the source's caller track through ``inference.api.replay_call`` (its progress on the row), then
post-processes the result like any call (``tasks.process_recording``: same files, same metrics). When the
source has agent tokens, the replay's are compared with them and the row says whether every step matched.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Literal

from celery import shared_task
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from inference import api
from inference.contracts import ParleyError
from webapp.common.errors import ApplicationError
from webapp.personas.selectors import persona_get_for, voice_get_for
from webapp.personas.services import voice_ref
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage
from webapp.recordings.tasks import _update, process_recording, without_paths

logger = logging.getLogger(__name__)
Status = Recording.Status
Pace = Literal["original", "fast"]


def replay_start(
    *,
    user: AbstractBaseUser,
    source: Recording,
    persona_id: int | None = None,
    voice: str | None = None,
    checkpoint: str = "",
    engine: str = "",
    pace: Pace = "fast",
    greedy: bool | None = None,
) -> Recording:
    """Queue a replay of ``source``; raises ``ApplicationError`` when it cannot be replayed as asked."""
    if "steps" not in source.files:
        raise ApplicationError("This recording cannot be replayed: it keeps no step-by-step record of the call.")
    if pace not in ("original", "fast"):
        raise ApplicationError("The pace is 'original' or 'fast'.")
    persona = None
    if persona_id is not None:
        persona = persona_get_for(user=user, persona_id=persona_id)
        if persona is None:
            raise ApplicationError("No such persona.")
    voice_row = None
    if voice:
        voice_row = voice_get_for(user=user, voice=voice, usable_only=True)
        if voice_row is None:
            raise ApplicationError("No such voice.")
    settings = {
        "persona": persona.instructions if persona is not None else None,
        "voice_id": voice_row.pk if voice_row is not None else None,
        "checkpoint": checkpoint or None,
        "engine": engine or None,
        "pace": pace,
        "greedy": greedy,
    }
    with transaction.atomic():
        row = Recording.objects.create(
            user=user,
            session_id=f"rp_{uuid.uuid4().hex}",
            source=source,
            engine=engine or source.engine,
            mode=source.mode,
            persona_id=persona.pk if persona is not None else source.persona_id,
            persona_name=persona.name if persona is not None else source.persona_name,
            persona_version=persona.version if persona is not None else source.persona_version,
            voice=voice_row.name if voice_row is not None else source.voice,
            checkpoint=checkpoint or source.checkpoint,
            started_at=timezone.now(),
            status=Status.RECORDING,
            status_reason="replay queued",
            replay=settings,
        )
        transaction.on_commit(lambda: replay_recording.delay(row.pk))
    return row


@shared_task(acks_late=True)
def replay_recording(recording_id: int) -> str:
    """Run the replay, then post-process it; returns the row's final status."""
    row = Recording.objects.filter(pk=recording_id).select_related("source").first()
    if row is None:
        return "deleted"
    if row.status != Status.RECORDING or row.ended_at is not None:
        return row.status  # already run
    source = row.source
    if source is None or "steps" not in source.files:
        return _fail(row, "the source recording is gone")
    settings = row.replay
    storage = recordings_storage()
    try:
        with storage.open(source.files["steps"], "rb") as f:
            steps = f.read()
        frames = _frames_by_step(source)
    except OSError as exc:
        return _fail(row, f"the source recording's files cannot be read ({type(exc).__name__})")
    voice = None
    if settings.get("voice_id") is not None:
        voice_row = voice_get_for(user=row.user, voice=settings["voice_id"])
        if voice_row is None:
            return _fail(row, "the voice is gone")
        voice = voice_ref(voice_row)
    elif source.voice:  # the call's own voice (by name: the recording keeps its name, not the file)
        voice_row = voice_get_for(user=row.user, voice=source.voice)
        voice = voice_ref(voice_row) if voice_row is not None else None
    _update(row, status_reason="replaying", progress=0.0)
    try:
        outcome = api.replay_call(
            steps,
            frames,
            session_id=row.session_id,
            engine=settings.get("engine"),
            checkpoint=settings.get("checkpoint"),
            persona=settings.get("persona"),
            voice=voice,
            greedy=settings.get("greedy"),
            pace=settings.get("pace", "fast"),
            progress=lambda f: _update(row, progress=round(f, 3), status_reason=f"replaying: {round(f * 100)} %"),
        )
    except ParleyError as exc:
        api.delete_raw_recording(row.session_id)
        return _fail(row, without_paths(exc.message))
    result = {**settings, "steps": outcome.steps, "seconds": round(outcome.seconds, 3), "engine_used": outcome.engine}
    _update(row, replay=result, ended_at=timezone.now(), close_reason="client_close", engine=outcome.engine)
    # Inline, in this worker: the comparison below needs the processed files.
    status = process_recording.apply(args=(row.pk,)).result  # an EagerResult: .get() is refused inside a task
    row.refresh_from_db()
    _compare_tokens(row, source)
    return status


def replay_tokens_match(row: Recording) -> bool | None:
    """Whether the replay's agent tokens equal its source's at every step (None: no tokens to compare)."""
    return row.replay.get("tokens_equal")


def _compare_tokens(row: Recording, source: Recording) -> None:
    if "steps" not in row.files:
        return
    storage = recordings_storage()
    with storage.open(source.files["steps"], "rb") as a, storage.open(row.files["steps"], "rb") as b:
        before, after = api.recording_agent_tokens(a.read()), api.recording_agent_tokens(b.read())
    if not before:
        return
    differing = [step for step in before if before[step] != after.get(step)]
    _update(
        row,
        replay={**row.replay, "tokens_equal": not differing and len(after) == len(before),
                "first_differing_step": differing[0] if differing else None},
    )  # fmt: skip


def _frames_by_step(source: Recording) -> dict[int, bytes]:
    if "frames_index" not in source.files:
        return {}
    storage = recordings_storage()
    with storage.open(source.files["frames_index"], "rb") as f:
        index = json.loads(f.read())["frames"]
    with storage.open(source.files["frames"], "rb") as f:
        blob = f.read()
    return {int(item["step"]): blob[item["offset"] : item["offset"] + item["size"]] for item in index}


def _fail(row: Recording, reason: str) -> str:
    _update(row, status=Status.FAILED, status_reason=f"replay failed: {reason}", ended_at=timezone.now())
    logger.warning("recordings.replay_failed", extra={"session_id": row.session_id, "reason": reason})
    return Status.FAILED
