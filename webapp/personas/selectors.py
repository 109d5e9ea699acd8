"""Permission-scoped lookups: a user sees their own rows and the shared ones (owner null); others' private
rows only with an explicit permission (``webapp.accounts.permissions.may``), never for being staff.

Every view, the realtime ``session.update`` path and the management pages go through these, so a
private persona or voice of another user is indistinguishable from a missing one.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet

from webapp.accounts.permissions import may
from webapp.personas.models import Persona, Voice

VIEW_ANY_PERSONA = "personas.view_persona"  # see (and call with) other users' private personas
CHANGE_ANY_PERSONA = "personas.change_persona"  # edit or archive shared personas and other users' own; share one
VIEW_ANY_VOICE = "personas.view_voice"  # see other users' private voices (list, page, status, preview)
USE_ANY_VOICE = "personas.use_any_voice"  # call with another user's private voice (realtime, persona default)
SHARE_VOICE = "personas.change_voice"  # upload a voice as shared


def _visible_to(user: AbstractBaseUser, permission: str) -> Q:
    if may(user, permission):
        return Q()
    return Q(owner__isnull=True) | Q(owner=user)


def persona_list_for(*, user: AbstractBaseUser, include_archived: bool = False) -> QuerySet[Persona]:
    rows = Persona.objects.filter(_visible_to(user, VIEW_ANY_PERSONA)).select_related("default_voice", "owner")
    return rows if include_archived else rows.filter(archived=False)


def voice_list_for(*, user: AbstractBaseUser, usable_only: bool = False) -> QuerySet[Voice]:
    """``usable_only``: the voices ``user`` may call with (ready, and another user's private one only with
    ``USE_ANY_VOICE``); else the voices they may look at."""
    permission = USE_ANY_VOICE if usable_only else VIEW_ANY_VOICE
    rows = Voice.objects.filter(_visible_to(user, permission)).select_related("owner")
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


def can_edit(*, user: AbstractBaseUser, row: Persona) -> bool:
    """Owners edit their personas; shared ones and other users' take ``CHANGE_ANY_PERSONA``."""
    return (row.owner_id is not None and row.owner_id == user.pk) or may(user, CHANGE_ANY_PERSONA)


def _as_pk(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.isdigit() and len(value) < 19:
        return int(value)
    return None
