"""Who a ``Bearer`` credential speaks for: the one place both realtime transports ask.

The WebSocket handshake (``webapp.conversations.auth``) and the WebRTC offer endpoint
(``webapp.webrtc.views``) ask ``webapp.conversations.client_secrets.realtime_identity``, which resolves an
ephemeral client secret (``ek_...``) itself and hands anything else to ``bearer_identity`` here (an API
key). For a secret the identity carries its grant: its user, the key it was minted under (revoking that
key ends its calls) and its session configuration, which the consumer applies and keeps fixed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser

from webapp.accounts.services import apikey_lookup


@dataclass(frozen=True)
class BearerIdentity:
    user: AbstractBaseUser
    api_key_id: int | None  # the key whose revocation ends the call (a client secret names its key)
    client_secret: Any = field(default=None)  # a spent client secret's grant (conversations.client_secrets.Grant)


def bearer_identity(*, raw: str) -> BearerIdentity | None:
    """The identity behind a bearer credential, or None when it is unknown, revoked or its user inactive.

    Synchronous (ORM): call it through ``database_sync_to_async``.
    """
    api_key = apikey_lookup(raw_key=raw)
    if api_key is None:
        return None
    return BearerIdentity(user=api_key.user, api_key_id=api_key.pk)
