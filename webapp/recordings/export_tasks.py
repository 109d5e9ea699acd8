"""Exporting an evaluation set for a user: the selection they may see, built off the request (Celery).

``export_start`` checks the filters and queues ``export_evaluation_set``; the task builds the set in a
temporary folder (``export.build``), zips it into the recordings storage and notes its progress on the
``EvaluationExport`` row, which the list page polls. The selection is made again inside the task with
the user's permissions as they are then, so a share withdrawn in between is respected.
"""

from __future__ import annotations

import io
import logging
import tempfile
from datetime import timedelta
from pathlib import Path

from celery import shared_task
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from webapp.common.errors import ApplicationError
from webapp.recordings import export, storage
from webapp.recordings.forms import selection_filters
from webapp.recordings.models import Recording
from webapp.recordings.review_models import EvaluationExport
from webapp.recordings.selectors import recordings_filtered, recordings_visible_to

logger = logging.getLogger(__name__)
MAX_CALLS = 500  # one zip in memory-free temp space; larger sets go through the management command
Status = EvaluationExport.Status


def selection_for(*, user: AbstractBaseUser, query: dict[str, str]) -> list[Recording]:
    """The exportable recordings the list page shows ``user`` for ``query`` (every page of it)."""
    visible = recordings_visible_to(user)
    engines = sorted(set(visible.order_by().values_list("engine", flat=True).distinct()))
    # everyone=True keeps the "only mine" filter; what the user may see is recordings_filtered's business.
    filters = selection_filters(user=user, query=query, engines=engines, everyone=True)
    return export.exportable(recordings_filtered(user=user, filters=filters))


def export_start(*, user: AbstractBaseUser, query: dict[str, str]) -> EvaluationExport:
    rows = selection_for(user=user, query=query)
    if not rows:
        raise ApplicationError("No playable recording matches these filters: nothing to export.")
    if len(rows) > MAX_CALLS:
        raise ApplicationError(f"{len(rows)} calls match; narrow the filters to {MAX_CALLS} or fewer.")
    job = EvaluationExport.objects.create(user=user, query=query, calls=len(rows))
    transaction.on_commit(lambda: export_evaluation_set.delay(job.pk))
    return job


@shared_task(acks_late=True)
def export_evaluation_set(export_id: int) -> str:
    job = EvaluationExport.objects.select_related("user").filter(pk=export_id).first()
    if job is None or job.status not in (Status.QUEUED, Status.RUNNING):
        return "gone" if job is None else job.status
    _update(job, status=Status.RUNNING, progress=0.01)
    try:
        rows = selection_for(user=job.user, query=job.query)
        with tempfile.TemporaryDirectory(prefix="parley-export-") as tmp:
            folder = Path(tmp) / "set"
            calls = export.build(rows, folder, progress=lambda f: _update(job, progress=round(0.9 * f, 3)))
            zipped = io.BytesIO()
            export.archive(folder, zipped)
        name = storage.save(f"exports/{job.user_id}/evaluation-set-{job.pk}.zip", zipped.getvalue())
    except (ApplicationError, export.ExportError) as exc:
        message = exc.message if isinstance(exc, ApplicationError) else str(exc)
        _update(job, status=Status.FAILED, reason=message)
        return Status.FAILED
    except OSError as exc:  # storage or temp space: the user reads the kind, the log has the rest
        logger.warning("recordings.export_failed", exc_info=True, extra={"export_id": job.pk})
        _update(job, status=Status.FAILED, reason=f"storing the set failed ({type(exc).__name__})")
        return Status.FAILED
    _update(job, status=Status.READY, progress=1.0, calls=calls, file=name)
    return Status.READY


def _update(job: EvaluationExport, **fields) -> None:
    for name, value in fields.items():
        setattr(job, name, value)
    EvaluationExport.objects.filter(pk=job.pk).update(**fields, updated_at=timezone.now())


def purge_expired_exports(*, days: int) -> int:
    """Delete exports older than the recordings' retention: a set holds the calls' audio, so it may not
    outlive them (``purge_recordings`` calls this; 0 days keeps them, as it keeps the recordings)."""
    if days <= 0:
        return 0
    old = EvaluationExport.objects.filter(created_at__lt=timezone.now() - timedelta(days=days))
    purged = 0
    for job in old.exclude(status__in=(Status.QUEUED, Status.RUNNING)):
        if job.file:
            storage.delete_all([job.file])
        job.delete()
        purged += 1
    return purged
