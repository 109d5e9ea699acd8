"""The review panel's forms (annotate, rate, tag, share) and the evaluation-set export.

Plain POST forms that redirect back, so every control works from the keyboard and without script;
``static/recordings/annotations.js`` only fills the span inputs from the timeline. Every route looks
the recording up through ``selectors.recording_get_for`` (404 for what the user may not see), and a
refused request comes back as a message on the page, never a server error.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from webapp.common.errors import ApplicationError
from webapp.recordings import annotations, sharing
from webapp.recordings.export_tasks import export_start
from webapp.recordings.review_models import Annotation, EvaluationExport, RecordingShare, RecordingTag
from webapp.recordings.selectors import recording_get_for
from webapp.recordings.storage import recordings_storage


def _back(recording_id: int) -> HttpResponse:
    return redirect(reverse("recording-detail", args=[recording_id]) + "#review-panel")


def _number(request: HttpRequest, name: str) -> float:
    raw = request.POST.get(name, "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise ApplicationError(f"{name.replace('_', ' ')}: {raw[:20]!r} is not a number of seconds.") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ApplicationError(f"{name.replace('_', ' ')} must be a number of seconds.")
    return value


def _integer(request: HttpRequest, name: str) -> int:
    raw = request.POST.get(name, "").strip()
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
        raise ApplicationError(f"Choose a {name}.")
    return int(raw)


@login_required
@require_POST
def annotation_add_view(request: HttpRequest, recording_id: int) -> HttpResponse:
    recording = recording_get_for(user=request.user, recording_id=recording_id)
    try:
        span = annotations.SpanRequest(
            label_id=_integer(request, "label"),
            start_s=_number(request, "start_s"),
            end_s=_number(request, "end_s"),
            note=request.POST.get("note", ""),
        )
        added = annotations.annotation_add(recording=recording, author=request.user, span=span)
        messages.success(request, f"Labelled {added.start_s:.1f}-{added.end_s:.1f} s as “{added.label.name}”.")
    except ApplicationError as exc:
        messages.error(request, exc.message)
    return _back(recording.pk)


@login_required
@require_POST
def annotation_delete_view(request: HttpRequest, recording_id: int, annotation_id: int) -> HttpResponse:
    recording = recording_get_for(user=request.user, recording_id=recording_id)
    annotation = get_object_or_404(Annotation, pk=annotation_id, recording=recording)
    try:
        annotations.annotation_delete(user=request.user, annotation=annotation)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    return _back(recording.pk)


@login_required
@require_POST
def rating_view(request: HttpRequest, recording_id: int) -> HttpResponse:
    recording = recording_get_for(user=request.user, recording_id=recording_id)
    try:
        rating = annotations.rating_set(recording=recording, author=request.user, stars=_integer(request, "rating"))
        messages.success(request, f"Rated {rating.stars} of 5.")
    except ApplicationError as exc:
        messages.error(request, exc.message)
    return _back(recording.pk)


@login_required
@require_POST
def tag_add_view(request: HttpRequest, recording_id: int) -> HttpResponse:
    recording = recording_get_for(user=request.user, recording_id=recording_id)
    try:
        annotations.tag_add(recording=recording, user=request.user, raw=request.POST.get("tag", "")[:200])
    except ApplicationError as exc:
        messages.error(request, exc.message)
    return _back(recording.pk)


@login_required
@require_POST
def tag_remove_view(request: HttpRequest, recording_id: int, tagged_id: int) -> HttpResponse:
    recording = recording_get_for(user=request.user, recording_id=recording_id)
    tagged = get_object_or_404(RecordingTag, pk=tagged_id, recording=recording)
    try:
        annotations.tag_remove(user=request.user, tagged=tagged)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    return _back(recording.pk)


@login_required
@require_POST
def share_view(request: HttpRequest, recording_id: int) -> HttpResponse:
    recording = recording_get_for(user=request.user, recording_id=recording_id)
    try:
        reviewer = sharing.share_check(
            user=request.user, recording=recording, reviewer_name=request.POST.get("reviewer", "").strip()
        )
        sharing.share_create(recording=recording, by=request.user, reviewer=reviewer)
        who = f"reviewer {reviewer.username}" if reviewer else "all reviewers"
        messages.success(request, f"Shared with {who}.")
    except ApplicationError as exc:
        messages.error(request, exc.message)
    return _back(recording.pk)


@login_required
@require_POST
def unshare_view(request: HttpRequest, recording_id: int, share_id: int) -> HttpResponse:
    recording = recording_get_for(user=request.user, recording_id=recording_id)
    share = get_object_or_404(RecordingShare, pk=share_id, recording=recording)
    try:
        sharing.share_delete(user=request.user, share=share)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    return _back(recording.pk)


@login_required
@require_POST
def export_view(request: HttpRequest) -> HttpResponse:
    """Export what the list shows for the filters in the form (the list's query, every page)."""
    query = {k: v for k, v in request.POST.items() if k not in ("csrfmiddlewaretoken", "page")}
    try:
        job = export_start(user=request.user, query=query)
        messages.success(request, f"Exporting {job.calls} call(s) as an evaluation set.")
    except ApplicationError as exc:
        messages.error(request, exc.message)
    return redirect(reverse("recording-list") + "#exports")


@login_required
def export_status(request: HttpRequest, export_id: int) -> JsonResponse:
    job = get_object_or_404(EvaluationExport, pk=export_id, user=request.user)
    url = reverse("recording-export-file", args=[job.pk]) if job.status == EvaluationExport.Status.READY else None
    return JsonResponse(
        {
            "id": job.pk,
            "status": job.status,
            "progress": job.progress,
            "reason": job.reason,
            "calls": job.calls,
            "url": url,
        }  # fmt: skip
    )


@login_required
def export_file(request: HttpRequest, export_id: int) -> FileResponse:
    job = get_object_or_404(EvaluationExport, pk=export_id, user=request.user, status=EvaluationExport.Status.READY)
    try:
        handle = recordings_storage().open(job.file, "rb")
    except FileNotFoundError as exc:
        raise Http404("The export is gone from storage.") from exc
    return FileResponse(handle, content_type="application/zip", filename=f"evaluation-set-{job.pk}.zip")
