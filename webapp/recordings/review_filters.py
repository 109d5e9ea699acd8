"""The list page's review filters: by label, tag and rating, and the search over review text.

Each filter is a ``pk__in`` subquery rather than a join, so a recording with many annotations or
ratings is still one row of the list (and one row of an export).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Avg, Q, QuerySet

from webapp.recordings.review_models import Annotation, Rating, RecordingTag


@dataclass(frozen=True)
class ReviewFilters:
    label: str = ""  # a label's name
    tag: str = ""  # a tag's name (case-insensitive)
    min_rating: int | None = None  # the mean of the call's ratings, at least this
    max_rating: int | None = None
    rated: str = ""  # "" any | "yes" rated by someone | "no" not yet rated


def review_search(q: str) -> Q:
    """Recordings whose labels, notes or tags contain ``q``."""
    spans = Annotation.objects.filter(Q(label__name__icontains=q) | Q(note__icontains=q))
    tags = RecordingTag.objects.filter(tag__name__icontains=q)
    return Q(pk__in=spans.values("recording_id")) | Q(pk__in=tags.values("recording_id"))


def review_filtered(rows: QuerySet, filters: ReviewFilters) -> QuerySet:
    if filters.label:
        rows = rows.filter(pk__in=Annotation.objects.filter(label__name=filters.label).values("recording_id"))
    if filters.tag:
        tagged = RecordingTag.objects.filter(tag__name=" ".join(filters.tag.split()).lower())
        rows = rows.filter(pk__in=tagged.values("recording_id"))
    if filters.min_rating is not None or filters.max_rating is not None:
        means = Rating.objects.values("recording_id").annotate(mean=Avg("stars"))
        if filters.min_rating is not None:
            means = means.filter(mean__gte=filters.min_rating)
        if filters.max_rating is not None:
            means = means.filter(mean__lte=filters.max_rating)
        rows = rows.filter(pk__in=means.values("recording_id"))
    if filters.rated == "yes":
        rows = rows.filter(pk__in=Rating.objects.values("recording_id"))
    elif filters.rated == "no":
        rows = rows.exclude(pk__in=Rating.objects.values("recording_id"))
    return rows
