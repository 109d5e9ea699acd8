"""Who sees which recordings, and the list page's filters."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet
from django.http import Http404

from webapp.accounts.permissions import may
from webapp.recordings.models import Recording
from webapp.recordings.review_filters import ReviewFilters, review_filtered, review_search
from webapp.recordings.sharing import shared_with

MAX_ID = 2**63  # a BigAutoField


VIEW_ANY_RECORDING = "recordings.view_recording"  # see, play and download other users' recordings
DELETE_ANY_RECORDING = "recordings.delete_recording"  # delete other users' recordings


def recordings_visible_to(user: AbstractBaseUser) -> QuerySet[Recording]:
    """A user's own recordings and those shared with them as a reviewer (``sharing``); everyone's only with
    ``VIEW_ANY_RECORDING`` (being staff is not enough)."""
    rows = Recording.objects.select_related("user")
    return rows if may(user, VIEW_ANY_RECORDING) else rows.filter(Q(user=user) | shared_with(user))


def may_see_everyones(user: AbstractBaseUser) -> bool:
    return may(user, VIEW_ANY_RECORDING)


def may_delete(*, user: AbstractBaseUser, recording: Recording) -> bool:
    return recording.user_id == user.pk or may(user, DELETE_ANY_RECORDING)


def recording_get_for(*, user: AbstractBaseUser, recording_id: int) -> Recording:
    """The recording if this user may see it; 404 otherwise (never 403: ids of others stay unknown)."""
    if not 0 < recording_id < MAX_ID:  # the URL takes any digits; the database would fail on a huge one
        raise Http404("No such recording.")
    recording = recordings_visible_to(user).filter(pk=recording_id).first()
    if recording is None:
        raise Http404("No such recording.")
    return recording


@dataclass(frozen=True)
class RecordingFilters:
    q: str = ""
    persona: str = ""
    voice: str = ""
    engine: str = ""
    status: str = ""
    date_from: date | None = None
    date_to: date | None = None
    min_duration_s: float | None = None
    max_duration_s: float | None = None
    mine: bool = False
    review: ReviewFilters = ReviewFilters()


def recordings_filtered(*, user: AbstractBaseUser, filters: RecordingFilters) -> QuerySet[Recording]:
    rows = recordings_visible_to(user)
    if filters.mine:
        rows = rows.filter(user=user)
    if filters.q:
        rows = rows.filter(
            Q(session_id__icontains=filters.q)
            | Q(persona_name__icontains=filters.q)
            | Q(voice__icontains=filters.q)
            | Q(transcript_text__icontains=filters.q)
            | Q(user__username__icontains=filters.q)
            | review_search(filters.q)
        )
    if filters.persona:
        rows = rows.filter(persona_name__icontains=filters.persona)
    if filters.voice:
        rows = rows.filter(voice__icontains=filters.voice)
    if filters.engine:
        rows = rows.filter(engine=filters.engine)
    if filters.status:
        rows = rows.filter(status=filters.status)
    if filters.date_from:
        rows = rows.filter(started_at__date__gte=filters.date_from)
    if filters.date_to:
        rows = rows.filter(started_at__date__lte=filters.date_to)
    if filters.min_duration_s is not None:
        rows = rows.filter(duration_s__gte=filters.min_duration_s)
    if filters.max_duration_s is not None:
        rows = rows.filter(duration_s__lte=filters.max_duration_s)
    return review_filtered(rows, filters.review)
