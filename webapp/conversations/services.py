"""Conversation lifecycle writes, session.update resolution and account checks (keyword-only, typed).

Called by the consumer through ``database_sync_to_async`` at session edges, on ``session.update`` and
every ``PARLEY_ACCOUNT_CHECK_S`` for a process's live calls, never per frame. Every refusal and fault leaves here
typed, as a ``ParleyError`` whose code the protocol names, so that the consumer only translates:
``persona_not_found`` / ``voice_not_found`` (with the param), ``AccountInactive``, and ``ServiceFault``
for a database fault or an unexpected one (``internal_error``; the fault is logged whole here).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import DatabaseError, transaction
from django.utils import timezone

from inference.contracts import ParleyError, VoiceRef
from webapp.conversations.models import Conversation
from webapp.conversations.protocol import ProtocolError
from webapp.personas.selectors import persona_get_for, voice_get_for
from webapp.personas.services import voice_ref

logger = logging.getLogger(__name__)


class ServiceFault(ParleyError):
    """Something failed below the consumer (the database, or a fault nobody expected): the caller gets
    ``internal_error`` and the session goes on; the log has the whole fault."""

    def __init__(self, message: str = "Internal error."):
        super().__init__(message, code="internal_error", error_type="server_error")


class AccountInactive(ParleyError):
    """The call's user was deactivated or deleted (by any means: the admin, a shell, a queryset update)."""

    def __init__(self):
        super().__init__("This account is no longer active.", code="forbidden")


@contextlib.contextmanager
def database_faults(what: str) -> Iterator[None]:
    """A database fault (down, locked, timed out) becomes a ``ServiceFault``."""
    try:
        yield
    except DatabaseError as exc:
        logger.exception("realtime.database_failed", extra={"what": what})
        raise ServiceFault("The database is not available; try again.") from exc


@contextlib.asynccontextmanager
async def unexpected_faults(what: str, **extra: object) -> AsyncIterator[None]:
    """The one edge where a fault nobody expected (a bug below the consumer) becomes a ``ServiceFault``, logged
    whole: the caller gets one ``internal_error`` and keeps the session. Typed errors pass unchanged."""
    try:
        yield
    except (ParleyError, ProtocolError):
        raise
    except Exception as exc:  # noqa: BLE001 - the edge itself: anything else is turned into a typed error here
        # Callables are read now, so that a value set after entering (the session id) is the one logged.
        logger.exception(what, extra={k: v() if callable(v) else v for k, v in extra.items()})
        raise ServiceFault() from exc


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


@dataclass(frozen=True)
class SessionChoices:
    """What a ``session.update`` asked for by id or name, resolved for its user (None: not asked)."""

    persona: PersonaChoice | None
    voice: VoiceChoice | None


def session_update_choices(*, user_id: object, persona_id: object | None, voice: object | None) -> SessionChoices:
    """Resolve the persona and voice of a ``session.update`` for the call's user, read afresh: a user
    deactivated since the call began is refused (``AccountInactive``), and permissions granted or taken
    since then count. Another user's private persona or voice is ``*_not_found``, like a missing one."""
    with database_faults("session_update"):
        user = _active_user(user_id)
        persona = None
        if persona_id is not None:
            persona = persona_resolve(user=user, persona_id=persona_id)
            if persona is None:
                raise ParleyError("No such persona.", code="persona_not_found", param="session.duplex.persona_id")
        choice = None
        if voice is not None:
            choice = voice_resolve(user=user, voice=voice)
            if choice is None:
                raise ParleyError("No such voice.", code="voice_not_found", param="session.audio.output.voice")
        return SessionChoices(persona=persona, voice=choice)


ACTIVE_IDS_PER_QUERY = 500  # under every backend's limit on a statement's parameters (SQLite's was 999)


def active_user_ids(*, user_ids: list[object]) -> set[object]:
    """Those of ``user_ids`` whose users exist and are active: every live call's check in one read a period
    (``ServiceFault`` if the database cannot say now)."""
    active: set[object] = set()
    with database_faults("account_check"):
        for i in range(0, len(user_ids), ACTIVE_IDS_PER_QUERY):
            chunk = user_ids[i : i + ACTIVE_IDS_PER_QUERY]
            active.update(get_user_model().objects.filter(pk__in=chunk, is_active=True).values_list("pk", flat=True))
    return active


def _active_user(user_id: object) -> AbstractBaseUser:
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        raise AccountInactive()
    return user
