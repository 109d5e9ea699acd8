"""Annotations, ratings and tags on a recording: checks, writes and what the review panel shows.

Anyone who may see a recording (``selectors.recording_get_for``) may annotate, rate and tag it;
removing another reviewer's annotation or tag takes the owner, or ``recordings.delete_annotation``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Avg, Count

from webapp.accounts.permissions import may
from webapp.common.errors import ApplicationError
from webapp.recordings.models import Recording
from webapp.recordings.review_models import Annotation, Label, Rating, RecordingTag, Tag

NOTE_MAX = 1000
TAG_MAX = 40
DURATION_SLACK_S = 0.5  # a span may end a little past the stored duration (the page rounds the playhead)
DELETE_ANY_ANNOTATION = "recordings.delete_annotation"
_TAG = re.compile(r"^[\w][\w .:+-]*$")


@dataclass(frozen=True)
class SpanRequest:
    label_id: int
    start_s: float
    end_s: float
    note: str = ""


def annotation_add_check(*, recording: Recording, span: SpanRequest) -> Label:
    label = Label.objects.filter(pk=span.label_id, active=True).first()
    if label is None:
        raise ApplicationError("Pick a label from the list.")
    if not (0 <= span.start_s < span.end_s):
        raise ApplicationError("A span needs a start before its end, both at or after 0 s.")
    if recording.duration_s is not None and span.end_s > recording.duration_s + DURATION_SLACK_S:
        raise ApplicationError(f"The span ends after the call ({recording.duration_s:.1f} s).")
    if len(span.note) > NOTE_MAX:
        raise ApplicationError(f"A note is at most {NOTE_MAX} characters.")
    return label


def annotation_add(*, recording: Recording, author: AbstractBaseUser, span: SpanRequest) -> Annotation:
    label = annotation_add_check(recording=recording, span=span)
    return Annotation.objects.create(
        recording=recording,
        author=author,
        label=label,
        start_s=round(span.start_s, 3),
        end_s=round(span.end_s, 3),
        note=span.note.strip(),
    )


def may_remove(*, user: AbstractBaseUser, recording: Recording, author_id: int | None) -> bool:
    return author_id == user.pk or recording.user_id == user.pk or may(user, DELETE_ANY_ANNOTATION)


def annotation_delete(*, user: AbstractBaseUser, annotation: Annotation) -> None:
    if not may_remove(user=user, recording=annotation.recording, author_id=annotation.author_id):
        raise ApplicationError("Only its author or the recording's owner can remove this annotation.")
    annotation.delete()


def rating_set(*, recording: Recording, author: AbstractBaseUser, stars: int) -> Rating:
    if not 1 <= stars <= 5:
        raise ApplicationError("A rating is 1 to 5.")
    rating, _ = Rating.objects.update_or_create(recording=recording, author=author, defaults={"stars": stars})
    return rating


def tag_name(raw: str) -> str:
    """The stored form of a tag: trimmed, lower case, single spaces; refused when empty or odd."""
    name = " ".join(raw.split()).lower()
    if not name or len(name) > TAG_MAX or not _TAG.match(name):
        raise ApplicationError(
            f"A tag is 1 to {TAG_MAX} letters, digits, spaces or . : + - _ (and starts with a letter or digit)."
        )
    return name


@transaction.atomic
def tag_add(*, recording: Recording, user: AbstractBaseUser, raw: str) -> RecordingTag:
    tag, _ = Tag.objects.get_or_create(name=tag_name(raw))
    tagged, _ = RecordingTag.objects.get_or_create(recording=recording, tag=tag, defaults={"added_by": user})
    return tagged


def tag_remove(*, user: AbstractBaseUser, tagged: RecordingTag) -> None:
    if not may_remove(user=user, recording=tagged.recording, author_id=tagged.added_by_id):
        raise ApplicationError("Only who added it or the recording's owner can remove this tag.")
    tagged.delete()


def review_of(*, recording: Recording, user: AbstractBaseUser) -> dict:
    """What the review panel shows: spans, the ratings' mean and count, the user's own rating, tags."""
    annotations = list(recording.annotations.select_related("label", "author"))
    ratings = recording.ratings.aggregate(mean=Avg("stars"), count=Count("pk"))
    mine = recording.ratings.filter(author=user).values_list("stars", flat=True).first()
    tags = list(recording.tagged.select_related("tag"))
    return {
        "annotations": [
            {
                "row": a,
                "removable": may_remove(user=user, recording=recording, author_id=a.author_id),
                "author": a.author.username if a.author else "(deleted user)",
            }
            for a in annotations
        ],
        "labels": Label.objects.filter(active=True),
        "rating_mean": ratings["mean"],
        "rating_count": ratings["count"],
        "my_rating": mine,
        "tags": [
            {"row": t, "removable": may_remove(user=user, recording=recording, author_id=t.added_by_id)} for t in tags
        ],
    }


def export_review(recording: Recording) -> dict:
    """The review rows of one recording as plain data, for the evaluation set."""
    annotations = [
        {
            "label": a.label.name,
            "start_s": a.start_s,
            "end_s": a.end_s,
            "note": a.note,
            "author": a.author.username if a.author else "",
        }
        for a in recording.annotations.select_related("label", "author")
    ]
    ratings = [{"stars": r.stars, "author": r.author.username} for r in recording.ratings.select_related("author")]
    return {
        "annotations": annotations,
        "labels": sorted({a["label"] for a in annotations}),
        "ratings": ratings,
        "rating_mean": round(sum(r["stars"] for r in ratings) / len(ratings), 3) if ratings else None,
        "tags": [t.tag.name for t in recording.tagged.select_related("tag")],
    }
