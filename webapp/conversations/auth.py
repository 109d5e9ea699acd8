"""WebSocket handshake guards: the origin policy and the credential (``Authorization: Bearer <api key or
client secret>``, or a browser's ``openai-insecure-api-key.<credential>`` subprotocol, see ``secret_scope``).

Order in ``webapp.asgi``: origin policy -> session-cookie auth -> bearer auth -> connect limits
-> router. A refused origin is closed before ``accept`` (HTTP 403), so nothing is allocated. A
throttled client is marked in ``scope["throttled"]`` (a ``throttling.Refusal``); the consumer accepts
only to say why (``rate_limit_exceeded``) and closes with 4429.
"""

from __future__ import annotations

from urllib.parse import urlparse

from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import validate_host

from webapp.common import throttling
from webapp.conversations.client_secrets import SECRET_PREFIX, realtime_identity
from webapp.conversations.secret_scope import subprotocol_credential


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


_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalized_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` lower-cased, without a default port; None for anything else."""
    try:
        parsed = urlparse(origin.strip().lower())
        port = parsed.port
    except ValueError:
        return None
    if parsed.scheme not in _DEFAULT_PORTS or not parsed.hostname or parsed.path not in ("", "/"):
        return None
    if parsed.username is not None or parsed.query or parsed.fragment:
        return None
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    default_port = port in (None, _DEFAULT_PORTS[parsed.scheme])
    return f"{parsed.scheme}://{host}" if default_port else f"{parsed.scheme}://{host}:{port}"


def own_origin(scope: dict) -> str | None:
    """The origin a page of this site has when it opens this socket: the Host header, if allowed."""
    host = _header(scope, b"host")
    if not host:
        return None
    domain = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    if not validate_host(domain.strip("[]").lower(), settings.ALLOWED_HOSTS):
        return None
    forwarded = (_header(scope, b"x-forwarded-proto") or "").lower() if settings.SECURE_PROXY_SSL_HEADER else ""
    secure = scope.get("scheme") == "wss" or forwarded == "https"
    return normalized_origin(f"{'https' if secure else 'http'}://{host}")


def origin_allowed(origin: str, scope: dict) -> bool:
    """The whole origin (scheme, host, port) is the site's own or in PARLEY_ALLOWED_ORIGINS."""
    candidate = normalized_origin(origin)
    if candidate is None:
        return False
    allowed = {normalized_origin(o) for o in settings.PARLEY_ALLOWED_ORIGINS} | {own_origin(scope)}
    return candidate in allowed - {None}


def credential(scope: dict) -> str | None:
    """The API key or client secret the client sent, in the Authorization header or as a subprotocol."""
    return bearer_key(scope) or subprotocol_credential(scope)


class OriginPolicyMiddleware:
    """Browsers send Origin: it must be the site's own origin or an allowed one (scheme, host and port),
    so another app on the same host cannot ride a caller's cookie. No Origin (SDKs) needs a key.

    A page that sends its credential as a subprotocol (OpenAI's browser form, normally a client secret its
    own server minted) may connect from any origin: the credential, not a cookie, authenticates it, and
    the cookie is then ignored (``BearerKeyAuthMiddleware`` decides the user from the credential alone)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            origin = _header(scope, b"origin")
            if origin is None:
                allowed = bearer_key(scope) is not None
            else:
                allowed = subprotocol_credential(scope) is not None or origin_allowed(origin, scope)
            if not allowed:
                return await WebsocketDenier()(scope, receive, send)
        return await self.app(scope, receive, send)


class ConnectLimitMiddleware:
    """After authentication: an authenticated connect counts against its API key or its user
    (``throttling.connect_refusal``); one without valid credentials is a failed authentication of its
    address (a wrong key was counted by ``BearerKeyAuthMiddleware``), refused once the address is over
    ``PARLEY_KEY_FAILURE_RATE``. Authenticated connects are never limited per address."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and "throttled" not in scope:
            user = scope.get("user")
            ip = throttling.client_ip(scope)
            refusal = None
            if user is not None and user.is_authenticated:
                refusal = await throttling.connect_refusal(user_id=user.pk, api_key_id=scope.get("api_key_id"))
            elif scope.get("auth_method") is None and (refusal := await throttling.key_refusal(ip)) is None:
                await throttling.record_key_failure(ip)
            if refusal is not None:
                scope = {**scope, "throttled": refusal}
        return await self.app(scope, receive, send)


class BearerKeyAuthMiddleware:
    """Sets ``scope["user"]`` (and ``scope["api_key_id"]``) from an API key or a client secret (which it
    spends, putting its ``Grant`` in ``scope["client_secret"]``; ``api_key_id`` is then the key that minted
    it, so revoking that key ends the session). A present but invalid credential means anonymous and counts
    against the client's ``PARLEY_KEY_FAILURE_RATE``: past it, credentials from that address are not even
    looked up until the window moves on."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        key = credential(scope)
        if key is not None and "throttled" not in scope:
            from django.contrib.auth.models import AnonymousUser

            if refusal := await throttling.key_refusal(throttling.client_ip(scope)):
                scope = {**scope, "throttled": refusal}
            else:
                identity = await database_sync_to_async(realtime_identity)(raw=key)
                method = "client_secret" if key.startswith(SECRET_PREFIX) else "api_key"
                if identity is None:
                    await throttling.record_key_failure(throttling.client_ip(scope))
                    scope = {**scope, "user": AnonymousUser(), "auth_method": method}
                else:
                    found = {"user": identity.user, "api_key_id": identity.api_key_id}
                    if identity.client_secret is not None:
                        found["client_secret"] = identity.client_secret
                    scope = {**scope, **found, "auth_method": method}
        return await self.app(scope, receive, send)
