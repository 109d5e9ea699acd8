"""Who a ``Bearer`` credential speaks for: the one place both realtime transports ask.

The WebSocket handshake (``webapp.conversations.auth``) and the WebRTC offer endpoint
(``webapp.webrtc.views``) call ``bearer_identity``. Today a bearer is an API key; an ephemeral client
secret minted for one session configuration is resolved here too, so both transports accept it alike:
it returns its user, the key it was minted under (revoking that key ends its calls) and its
session configuration, which the transport applies as the session's first ``session.update``.
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
    session: dict[str, Any] | None = field(default=None)  # a client secret's session configuration


def bearer_identity(*, raw: str) -> BearerIdentity | None:
    """The identity behind a bearer credential, or None when it is unknown, revoked or its user inactive.

    Synchronous (ORM): call it through ``database_sync_to_async``.
    """
    api_key = apikey_lookup(raw_key=raw)
    if api_key is None:
        return None
    return BearerIdentity(user=api_key.user, api_key_id=api_key.pk)
