"""Review pages: the list, the detail page with synchronised playback, files, zip and delete.

Every route looks the recording up through ``selectors.recording_get_for``: another user's id is a
404 everywhere (page, status, files, zip, delete) unless the user holds ``recordings.view_recording``;
deleting another user's recording takes ``recordings.delete_recording`` too.
"""

from __future__ import annotations

import io
import zipfile

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from inference import api
from webapp.recordings import sharing
from webapp.recordings.annotations import review_of
from webapp.recordings.forms import RecordingFilterForm
from webapp.recordings.models import EvaluationExport, Recording
from webapp.recordings.replay_views import review_extras
from webapp.recordings.selectors import (
    may_delete,
    may_see_everyones,
    recording_get_for,
    recordings_filtered,
    recordings_visible_to,
)
from webapp.recordings.services import recording_delete
from webapp.recordings.storage import recordings_storage
from webapp.recordings.tasks import process_recording

PAGE_SIZE = 20
ZIP_LEAVES_OUT = ("steps", "frames")  # for replays and the frame view; the zip has the MP4 of a video call
FORGOTTEN_PER_VIEW = 3  # eager (embedded) processing runs inline: keep one page view's share small
CONTENT_TYPES = {
    "ogg": "audio/ogg",
    "wav": "audio/wav",
    "peaks": "application/json",
    "transcript": "application/json",
    "timeline": "application/json",
    "mp4": "video/mp4",  # a video call's frames and both channels (video.py)
    "frames_index": "application/json",
    "steps": "application/octet-stream",  # what the engine got step by step (replays)
}


@login_required
def recording_list(request: HttpRequest) -> HttpResponse:
    visible = recordings_visible_to(request.user)
    engines = sorted(set(visible.order_by().values_list("engine", flat=True).distinct()))
    everyone = may_see_everyones(request.user)
    others = everyone or sharing.is_reviewer(request.user)  # sees recordings of other users (all, or shared)
    form = RecordingFilterForm(request.GET or None, engines=engines, everyone=others)
    _process_forgotten(visible)
    rows = recordings_filtered(user=request.user, filters=form.filters())
    page = Paginator(rows.prefetch_related("tagged__tag", "annotations__label"), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "everyone": everyone,
        "others": others,
        "exports": EvaluationExport.objects.filter(user=request.user)[:5],
        "export_query": [(key, value) for key, value in request.GET.items() if key != "page"],
    }
    return render(request, "recordings/list.html", context)


@login_required
def recording_detail(request: HttpRequest, recording_id: int) -> HttpResponse:
    recording = recording_get_for(user=request.user, recording_id=recording_id)
    urls = {kind: reverse("recording-file", args=[recording.pk, kind]) for kind in recording.files}
    may_share = sharing.may_share(user=request.user, recording=recording)
    context = {
        "recording": recording,
        "file_urls": urls,
        "review": review_of(recording=recording, user=request.user),
        "may_share": may_share,
        "shares": sharing.shares_of(recording) if may_share else [],
        "reviewers": sharing.reviewers().exclude(pk=recording.user_id) if may_share else [],
        **review_extras(request.user, recording),  # frames, the replay form and the replays of this call
    }
    return render(request, "recordings/detail.html", context)


@login_required
def recording_of_session(request: HttpRequest, session_id: str) -> HttpResponse:
    """The call page's link after hang-up: it knows the session, not the recording's id."""
    row = recordings_visible_to(request.user).filter(session_id=session_id[:100]).values_list("pk", flat=True).first()
    if row is None:
        raise Http404("No recording of this call (it was not recorded, or it has been deleted).")
    return redirect("recording-detail", recording_id=row)


@login_required
def recording_status(request: HttpRequest, recording_id: int) -> JsonResponse:
    return JsonResponse(_status(recording_get_for(user=request.user, recording_id=recording_id)))


@login_required
def recording_statuses(request: HttpRequest) -> JsonResponse:
    """The list page's progress poll: ``?ids=1,2,3`` (ids not visible to the user are left out)."""
    parts = (part.strip() for part in request.GET.get("ids", "").split(","))
    # ASCII digits only and at most 18 of them: int() refuses superscripts and 4300+ digits (a 500 before).
    ids = [int(part) for part in parts if part.isascii() and part.isdigit() and len(part) <= 18][:100]
    rows = recordings_visible_to(request.user).filter(pk__in=ids)
    return JsonResponse({"recordings": [_status(r) for r in rows]})


@login_required
def recording_file(request: HttpRequest, recording_id: int, kind: str) -> FileResponse:
    recording = recording_get_for(user=request.user, recording_id=recording_id)
    name = recording.files.get(kind)
    if name is None or kind not in CONTENT_TYPES:
        raise Http404("No such file.")
    storage = recordings_storage()
    try:
        handle = storage.open(name, "rb")
    except FileNotFoundError as exc:
        raise Http404("The file is gone from storage.") from exc
    return FileResponse(handle, content_type=CONTENT_TYPES[kind], filename=name.rsplit("/", 1)[-1])


@login_required
def recording_zip(request: HttpRequest, recording_id: int) -> HttpResponse:
    """Audio, transcript and timeline in one zip (built in memory: a call's files are a few MB)."""
    recording = recording_get_for(user=request.user, recording_id=recording_id)
    if not recording.files:
        raise Http404("This recording has no files yet.")
    storage = recordings_storage()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for kind, name in recording.files.items():
            if kind in ZIP_LEAVES_OUT:
                continue
            with storage.open(name, "rb") as f:
                archive.writestr(name.rsplit("/", 1)[-1], f.read())
        archive.writestr("transcript.txt", recording.transcript_text + "\n")
    response = HttpResponse(buffer.getvalue(), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{recording.session_id}.zip"'
    return response


@login_required
def recording_delete_view(request: HttpRequest, recording_id: int) -> HttpResponse:
    recording = recording_get_for(user=request.user, recording_id=recording_id)  # 404 before 405
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not may_delete(user=request.user, recording=recording):
        raise PermissionDenied("Deleting another user's recording takes the delete_recording permission.")
    recording_delete(recording)
    return redirect("recording-list")


def _process_forgotten(visible) -> None:
    """Queue post-processing for calls that ended while nobody listened (a detached call whose grace
    expired; a service restarted after a kill). The beat's sweep does this too; a list view that
    shows them makes sure it happens even where no beat runs (the embedded default)."""
    waiting = visible.filter(status=Recording.Status.RECORDING).select_related(None).only("pk", "session_id")
    for recording in waiting[:FORGOTTEN_PER_VIEW]:
        if api.raw_recording_state(recording.session_id) == "finished":
            process_recording.delay(recording.pk)


def _status(recording: Recording) -> dict:
    return {
        "id": recording.pk,
        "status": recording.status,
        "progress": recording.progress,
        "reason": recording.status_reason,
        "playable": recording.playable,
        "duration_s": recording.duration_s,
        "echo_flagged": bool((recording.echo_leak or {}).get("flagged")),
        "stage": recording.stage,
    }
