"""Permission-scoped lookups: a user sees their own rows and the shared ones (owner null); staff see all.

Every view, the realtime ``session.update`` path and the management pages go through these, so a
private persona or voice of another user is indistinguishable from a missing one.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet

from webapp.personas.models import Persona, Voice


def _visible_to(user: AbstractBaseUser) -> Q:
    if getattr(user, "is_staff", False):
        return Q()
    return Q(owner__isnull=True) | Q(owner=user)


def persona_list_for(*, user: AbstractBaseUser, include_archived: bool = False) -> QuerySet[Persona]:
    rows = Persona.objects.filter(_visible_to(user)).select_related("default_voice", "owner")
    return rows if include_archived else rows.filter(archived=False)


def voice_list_for(*, user: AbstractBaseUser, usable_only: bool = False) -> QuerySet[Voice]:
    rows = Voice.objects.filter(_visible_to(user)).select_related("owner")
    return rows.filter(status=Voice.Status.READY) if usable_only else rows


def persona_get_for(*, user: AbstractBaseUser, persona_id: object, include_archived: bool = False) -> Persona | None:
    """The persona by primary key if ``user`` may see it, else None (also for malformed ids)."""
    pk = _as_pk(persona_id)
    if pk is None:
        return None
    return persona_list_for(user=user, include_archived=include_archived).filter(pk=pk).first()


def voice_get_for(*, user: AbstractBaseUser, voice: object, usable_only: bool = False) -> Voice | None:
    """A voice by primary key or by exact name, if ``user`` may see it, else None."""
    pk = _as_pk(voice)
    visible = voice_list_for(user=user, usable_only=usable_only)
    if pk is not None:
        return visible.filter(pk=pk).first()
    if isinstance(voice, str) and 0 < len(voice) <= 100:
        # Prefer the user's own voice over a shared one of the same name.
        return visible.filter(name=voice, owner=user).first() or visible.filter(name=voice, owner__isnull=True).first()
    return None


def can_edit(*, user: AbstractBaseUser, row: Persona | Voice) -> bool:
    """Owners edit their rows; shared rows and everything else are staff's."""
    return bool(getattr(user, "is_staff", False)) or (row.owner_id is not None and row.owner_id == user.pk)


def _as_pk(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.isdigit() and len(value) < 19:
        return int(value)
    return None
