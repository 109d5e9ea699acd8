"""Owner-scoped lookups: a user sees their own rows and the shared ones (owner null)."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet

from webapp.personas.models import Persona, Voice


def _visible_to(user: AbstractBaseUser) -> Q:
    return Q(owner__isnull=True) | Q(owner=user)


def persona_list_for(*, user: AbstractBaseUser) -> QuerySet[Persona]:
    return Persona.objects.filter(_visible_to(user))


def voice_list_for(*, user: AbstractBaseUser) -> QuerySet[Voice]:
    return Voice.objects.filter(_visible_to(user))


def persona_get_for(*, user: AbstractBaseUser, persona_id: object) -> Persona | None:
    """The persona by primary key if ``user`` may use it, else None (also for malformed ids)."""
    pk = _as_pk(persona_id)
    return None if pk is None else persona_list_for(user=user).filter(pk=pk).first()


def voice_get_for(*, user: AbstractBaseUser, voice: object) -> Voice | None:
    """A voice by primary key or by exact name, if ``user`` may use it, else None."""
    pk = _as_pk(voice)
    visible = voice_list_for(user=user)
    if pk is not None:
        return visible.filter(pk=pk).first()
    if isinstance(voice, str) and 0 < len(voice) <= 100:
        # Prefer the user's own voice over a shared one of the same name.
        return visible.filter(name=voice, owner=user).first() or visible.filter(name=voice).first()
    return None


def _as_pk(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.isdigit() and len(value) < 19:
        return int(value)
    return None
