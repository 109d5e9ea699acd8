"""Conversation lifecycle writes and session.update resolution (keyword-only, typed).

Called by the consumer through ``database_sync_to_async`` at session edges only.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from inference.contracts import VoiceRef
from webapp.conversations.models import Conversation
from webapp.personas.selectors import persona_get_for, voice_get_for
from webapp.personas.services import voice_ref


@transaction.atomic
def conversation_open(*, user: AbstractBaseUser, session_id: str, engine: str) -> Conversation:
    """The row of a session that became live on a socket (new, resumed or taken over)."""
    conversation, created = Conversation.objects.get_or_create(
        session_id=session_id, defaults={"user": user, "engine": engine}
    )
    if created:
        # A user has at most one live session, so an older row still unfinished belongs to a session
        # that ended while no socket was there to hear it (grace expired while detached, or a restart).
        Conversation.objects.filter(user=user, ended_at__isnull=True).exclude(pk=conversation.pk).update(
            status=Conversation.Status.CLOSED, close_reason="superseded", ended_at=timezone.now()
        )
    elif conversation.status != Conversation.Status.OPEN:
        conversation.status = Conversation.Status.OPEN
        conversation.save(update_fields=["status"])
    return conversation


def conversation_detach(*, session_id: str) -> None:
    Conversation.objects.filter(session_id=session_id, status=Conversation.Status.OPEN).update(
        status=Conversation.Status.DETACHED
    )


def conversation_close(*, session_id: str, reason: str) -> None:
    status = Conversation.Status.FAILED if reason == "engine_failed" else Conversation.Status.CLOSED
    Conversation.objects.filter(session_id=session_id, ended_at__isnull=True).update(
        status=status, close_reason=reason[:30], ended_at=timezone.now()
    )


@dataclass(frozen=True)
class PersonaChoice:
    persona_id: int
    version: int
    instructions: str
    name: str


@dataclass(frozen=True)
class VoiceChoice:
    voice_id: int
    name: str
    ref: VoiceRef


def persona_resolve(*, user: AbstractBaseUser, persona_id: object) -> PersonaChoice | None:
    persona = persona_get_for(user=user, persona_id=persona_id)
    if persona is None:
        return None
    return PersonaChoice(
        persona_id=persona.pk, version=persona.version, instructions=persona.instructions, name=persona.name
    )


def voice_resolve(*, user: AbstractBaseUser, voice: object) -> VoiceChoice | None:
    """A voice ``user`` may use for a new call (ready: not pending, failed or disabled), else None."""
    row = voice_get_for(user=user, voice=voice, usable_only=True)
    if row is None:
        return None
    return VoiceChoice(voice_id=row.pk, name=row.name, ref=voice_ref(row))
