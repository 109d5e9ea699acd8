"""Ephemeral client secrets: minted with an API key, spent by one ``/v1/realtime`` connect.

A browser app must not hold a long-lived key: its own server mints a secret (``POST
/v1/realtime/client_secrets``, OpenAI GA's request and response shape) and hands it to the page, which
connects with it (the ``openai-insecure-api-key.<secret>`` subprotocol, or ``Authorization: Bearer``).

- short-lived: ``expires_after.seconds`` (10 s to ``PARLEY_CLIENT_SECRET_MAX_TTL_S``), default
  ``PARLEY_CLIENT_SECRET_TTL_S``;
- single-use: the connect that presents it spends it, atomically (OpenAI lets one open several sessions
  until it expires; a secret that leaks from a page is worth less this way);
- scoped: the session configuration given at mint time is applied to the session it opens, and the
  fields it names cannot be changed by the client afterwards (``secret_scope``);
- revocable with its key: a revoked or deleted key, or an inactive user, makes its unused secrets
  worthless (checked when spent), and the sessions they opened join the key's revocation group.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import Field, ValidationError

from inference.contracts import ParleyError
from webapp.accounts.bearer import BearerIdentity, bearer_identity
from webapp.accounts.models import ApiKey
from webapp.conversations import protocol as p
from webapp.conversations import services
from webapp.conversations.models import ClientSecret

SECRET_PREFIX = "ek_"  # OpenAI's prefix: the browser SDK refuses any other key in a page unless told it is insecure
MAX_BODY_BYTES = 64 * 1024


class ExpiresAfter(p._Lenient):
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(ge=10, le=7200)


class MintSession(p.SessionConfig):
    """The GA session configuration of a mint request: our ``session.update`` fields plus the model."""

    type: Literal["realtime"] = "realtime"
    model: p.CleanText | None = Field(default=None, max_length=100)


class MintRequest(p._Lenient):
    expires_after: ExpiresAfter | None = None
    session: MintSession = Field(default_factory=MintSession)


@dataclass(frozen=True)
class Grant:
    """What a spent secret gives the connect that presented it."""

    secret_id: int
    api_key_id: int
    user: Any
    model: str | None
    session: p.SessionConfig


def secret_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def parse_mint_request(body: bytes) -> MintRequest:
    """The request body as a ``MintRequest``, or ``ProtocolError`` (``invalid_json`` / ``invalid_value``)."""
    if len(body) > MAX_BODY_BYTES:
        raise p.ProtocolError("request_too_large", f"The body exceeds {MAX_BODY_BYTES} bytes.")
    try:
        raw = json.loads(body or b"{}", parse_int=p._parse_int)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise p.ProtocolError("invalid_json", f"The body is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise p.ProtocolError("invalid_json", "The body must be a JSON object.")
    try:
        request = MintRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise p.ProtocolError("invalid_value", f"{where}: {first['msg']}", param=where or None) from None
    if request.expires_after and request.expires_after.seconds > settings.PARLEY_CLIENT_SECRET_MAX_TTL_S:
        raise p.ProtocolError(
            "invalid_value",
            f"expires_after.seconds: at most {settings.PARLEY_CLIENT_SECRET_MAX_TTL_S} on this server.",
            param="expires_after.seconds",
        )
    return request


def client_secret_create(*, api_key: ApiKey, request: MintRequest) -> tuple[ClientSecret, str]:
    """Mint a secret for ``request.session``; returns the row and the raw secret (never stored).

    The persona and voice it names must be usable by the key's user now (``persona_not_found`` /
    ``voice_not_found``); they are resolved again when the session opens.
    """
    config = request.session
    services.session_update_choices(
        user_id=api_key.user_id,
        persona_id=config.duplex.persona_id if config.duplex else None,
        voice=config.audio.output.voice if config.audio and config.audio.output else None,
    )
    ttl = request.expires_after.seconds if request.expires_after else settings.PARLEY_CLIENT_SECRET_TTL_S
    raw = SECRET_PREFIX + secrets.token_urlsafe(32)
    row = ClientSecret.objects.create(
        api_key=api_key,
        secret_hash=secret_hash(raw),
        model=config.model or "",
        session=config.model_dump(mode="json", exclude_unset=True, exclude={"type", "model"}),
        expires_at=timezone.now() + timedelta(seconds=ttl),
    )
    return row, raw


@transaction.atomic
def client_secret_spend(*, raw: str) -> Grant | None:
    """The grant of an unused, unexpired secret whose key and user are still good, spending it; else None."""
    if not raw.startswith(SECRET_PREFIX) or len(raw) > 200:
        return None
    now = timezone.now()
    row = (
        ClientSecret.objects.select_for_update()
        .select_related("api_key__user")
        .filter(
            secret_hash=secret_hash(raw),
            used_at__isnull=True,
            expires_at__gt=now,
            api_key__revoked_at__isnull=True,
            api_key__user__is_active=True,
        )
        .first()
    )
    if row is None:
        return None
    # The filter on used_at makes a concurrent second spend update nothing (SQLite has no row locks).
    if ClientSecret.objects.filter(pk=row.pk, used_at__isnull=True).update(used_at=now) != 1:
        return None
    ApiKey.objects.filter(pk=row.api_key_id).update(last_used_at=now)
    return Grant(
        secret_id=row.pk,
        api_key_id=row.api_key_id,
        user=row.api_key.user,
        model=row.model or None,
        session=p.SessionConfig.model_validate(row.session),
    )


def realtime_identity(*, raw: str) -> BearerIdentity | None:
    """Who a bearer credential of either realtime transport speaks for: a client secret (spent here) or an
    API key; None when it is unknown, spent, expired, revoked, or its user inactive."""
    if raw.startswith(SECRET_PREFIX):
        grant = client_secret_spend(raw=raw)
        if grant is None:
            return None
        return BearerIdentity(user=grant.user, api_key_id=grant.api_key_id, client_secret=grant)
    return bearer_identity(raw=raw)


def minted_session_object(row: ClientSecret) -> dict[str, Any]:
    """The response's ``session``: the GA session object as far as it is known before a session exists."""
    config = dict(row.session)
    return {
        "type": "realtime",
        "object": "realtime.session",
        "model": row.model or settings.PARLEY_DEFAULT_MODEL,
        "output_modalities": ["audio"],
        "instructions": config.get("instructions"),
        "audio": config.get("audio") or {},
        **({"duplex": config["duplex"]} if config.get("duplex") else {}),
    }


def refusal_status(exc: p.ProtocolError | ParleyError) -> int:
    return 404 if exc.code.endswith("_not_found") else 400
