"""WebSocket handshake guards: the origin policy and ``Authorization: Bearer <api key>``.

Order in ``webapp.asgi``: origin policy -> session-cookie auth -> bearer auth -> router. A
refused handshake is closed before ``accept`` (HTTP 403), so nothing is allocated.
"""

from __future__ import annotations

from urllib.parse import urlparse

from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import validate_host

from webapp.accounts.services import apikey_authenticate


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def bearer_key(scope: dict) -> str | None:
    """The API key of an ``Authorization: Bearer`` header, or None."""
    header = _header(scope, b"authorization")
    if not header:
        return None
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


def origin_allowed(origin: str) -> bool:
    parsed = urlparse(origin)
    if parsed.scheme not in {"http", "https"} or not parsed.hostname:
        return False
    return validate_host(parsed.hostname, settings.ALLOWED_HOSTS)


class OriginPolicyMiddleware:
    """Browsers send Origin: it must be an allowed host. No Origin (SDKs) is accepted only with a key."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            origin = _header(scope, b"origin")
            allowed = origin_allowed(origin) if origin is not None else bearer_key(scope) is not None
            if not allowed:
                return await WebsocketDenier()(scope, receive, send)
        return await self.app(scope, receive, send)


class BearerKeyAuthMiddleware:
    """Sets ``scope["user"]`` from a Bearer API key; a present but invalid key means anonymous."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        key = bearer_key(scope)
        if key is not None:
            from django.contrib.auth.models import AnonymousUser

            user = await database_sync_to_async(apikey_authenticate)(raw_key=key)
            scope = {**scope, "user": user or AnonymousUser(), "auth_method": "api_key"}
        return await self.app(scope, receive, send)
