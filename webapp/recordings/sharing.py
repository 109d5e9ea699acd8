"""Reviewers and sharing: who besides its owner sees a recording.

Reviewers are the members of the ``reviewers`` group (made by migration 0005). An owner shares a
recording with the whole group or with one named member; a reviewer sees it from then on, and only
while they are in the group. Staff act on other users' recordings only with an explicit grant
(``accounts.permissions.may``): sharing someone else's recording takes ``recordings.add_recordingshare``.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.db.models import Q, QuerySet

from webapp.accounts.permissions import may
from webapp.common.errors import ApplicationError
from webapp.recordings.models import Recording
from webapp.recordings.review_models import RecordingShare

REVIEWERS_GROUP = "reviewers"
SHARE_ANY_RECORDING = "recordings.add_recordingshare"


def reviewers_group() -> Group:
    return Group.objects.get_or_create(name=REVIEWERS_GROUP)[0]


def is_reviewer(user: AbstractBaseUser) -> bool:
    return user.is_authenticated and user.groups.filter(name=REVIEWERS_GROUP).exists()


def reviewers() -> QuerySet:
    return get_user_model().objects.filter(groups__name=REVIEWERS_GROUP, is_active=True).order_by("username")


def shared_with(user: AbstractBaseUser) -> Q:
    """The recordings shared with ``user`` (a condition on ``Recording``); nothing unless they are a reviewer."""
    if not is_reviewer(user):
        return Q(pk__in=[])
    shares = RecordingShare.objects.filter(Q(reviewer=user) | Q(group__name=REVIEWERS_GROUP))
    return Q(pk__in=shares.values("recording_id"))


def may_share(*, user: AbstractBaseUser, recording: Recording) -> bool:
    return recording.user_id == user.pk or may(user, SHARE_ANY_RECORDING)


def share_check(*, user: AbstractBaseUser, recording: Recording, reviewer_name: str) -> AbstractBaseUser | None:
    """The named reviewer to share with (None: the whole group); refuses what may not be shared."""
    if not may_share(user=user, recording=recording):
        raise ApplicationError("Only the recording's owner (or staff allowed to share recordings) can share it.")
    if not reviewer_name:
        return None
    reviewer = reviewers().filter(username=reviewer_name[:150]).first()
    if reviewer is None:
        raise ApplicationError(f"{reviewer_name[:150]} is not a reviewer.")
    return reviewer


def share_create(*, recording: Recording, by: AbstractBaseUser, reviewer: AbstractBaseUser | None) -> RecordingShare:
    audience = {"reviewer": reviewer} if reviewer is not None else {"group": reviewers_group()}
    share, _ = RecordingShare.objects.get_or_create(recording=recording, **audience, defaults={"shared_by": by})
    return share


def share_delete(*, user: AbstractBaseUser, share: RecordingShare) -> None:
    if not may_share(user=user, recording=share.recording):
        raise ApplicationError("Only the recording's owner (or staff allowed to share recordings) can unshare it.")
    share.delete()


def shares_of(recording: Recording) -> list[dict]:
    """What the page lists: who sees this recording besides its owner."""
    rows = recording.shares.select_related("group", "reviewer").order_by("created_at")
    return [
        {"id": s.pk, "audience": f"reviewer {s.reviewer.username}" if s.reviewer else "all reviewers"} for s in rows
    ]
