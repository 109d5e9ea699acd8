"""Account actions: API keys and invites (HackSoft ``<entity>_<action>``, keyword-only)."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from webapp.accounts.models import ApiKey, Invite
from webapp.common.errors import ApplicationError

KEY_PREFIX = "pk_"  # makes a leaked Parley key recognisable in logs and secret scanners
VISIBLE_PREFIX_LEN = 11  # "pk_" + 8 random characters


def apikey_hash(raw_key: str) -> str:
    """Keys are 256-bit random, so a plain SHA-256 is enough (no slow hash needed)."""
    return hashlib.sha256(raw_key.encode()).hexdigest()


def apikey_create(*, user: AbstractBaseUser, name: str = "") -> tuple[ApiKey, str]:
    """Create a key; returns the row and the raw key, which is never stored and shown only once."""
    raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
    api_key = ApiKey.objects.create(
        user=user, name=name[:100], prefix=raw_key[:VISIBLE_PREFIX_LEN], key_hash=apikey_hash(raw_key)
    )
    return api_key, raw_key


def apikey_revoke(*, api_key: ApiKey) -> ApiKey:
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
    return api_key


def apikey_lookup(*, raw_key: str) -> ApiKey | None:
    """The unrevoked key of an active user matching ``raw_key``, else None. Records when it was last used."""
    if not raw_key.startswith(KEY_PREFIX) or len(raw_key) > 200:
        return None
    api_key = (
        ApiKey.objects.select_related("user")
        .filter(key_hash=apikey_hash(raw_key), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if api_key is None:
        return None
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=timezone.now())
    return api_key


def apikey_authenticate(*, raw_key: str) -> AbstractBaseUser | None:
    """The active user owning an unrevoked key, else None."""
    api_key = apikey_lookup(raw_key=raw_key)
    return None if api_key is None else api_key.user


def invite_create(*, created_by: AbstractBaseUser | None, note: str = "") -> Invite:
    return Invite.objects.create(code=secrets.token_urlsafe(12), note=note[:200], created_by=created_by)


@transaction.atomic
def invite_redeem(*, code: str, username: str, password: str) -> AbstractBaseUser:
    """Create an account with an unused invite code; the code is then spent."""
    invite = Invite.objects.select_for_update().filter(code=code.strip()).first()
    if invite is None or invite.is_used:
        raise ApplicationError("This invite code is not valid or has already been used.")
    user = get_user_model().objects.create_user(username=username, password=password)
    invite.used_by = user
    invite.used_at = timezone.now()
    invite.save(update_fields=["used_by", "used_at"])
    return user
