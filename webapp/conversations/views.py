"""``POST /v1/realtime/client_secrets``: an API key mints an ephemeral secret (see ``client_secrets``).

OpenAI GA's shape: the body ``{"expires_after": {"anchor": "created_at", "seconds": N}, "session": {...}}``,
the answer ``{"value": "ek_...", "expires_at": <unix s>, "session": {...}}``; errors are
``{"error": {"message", "type", "code", "param"}}`` with an HTTP status. Wrong keys count against the
address's ``PARLEY_KEY_FAILURE_RATE`` like wrong keys on the WebSocket.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from inference.contracts import ParleyError
from webapp.accounts.services import apikey_lookup
from webapp.common import throttling
from webapp.conversations import client_secrets
from webapp.conversations import protocol as p


def _error(status: int, code: str, message: str, *, error_type: str = "invalid_request_error", param=None):
    body = {"error": {"message": message, "type": error_type, "code": code, "param": param}}
    return JsonResponse(body, status=status)


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


@csrf_exempt  # no cookie is used: only the Authorization header authenticates
async def client_secret_mint(request: HttpRequest):
    if request.method != "POST":
        return _error(405, "method_not_allowed", "Use POST.")
    ip = throttling.client_ip(request.scope)
    if refusal := await throttling.key_refusal(ip):
        return _error(429, "rate_limit_exceeded", refusal.message, error_type="rate_limit_error")
    key = _bearer(request)
    api_key = await sync_to_async(apikey_lookup)(raw_key=key) if key else None
    if api_key is None:
        if key is not None:
            await throttling.record_key_failure(ip)
        return _error(401, "invalid_api_key", "Send a valid API key as Authorization: Bearer <key>.")
    try:
        mint = client_secrets.parse_mint_request(request.body)
        row, raw = await sync_to_async(client_secrets.client_secret_create)(api_key=api_key, request=mint)
    except (p.ProtocolError, ParleyError) as exc:
        status = client_secrets.refusal_status(exc)
        return _error(status, exc.code, exc.message, error_type=exc.error_type, param=exc.param)
    return JsonResponse(
        {
            "value": raw,
            "expires_at": int(row.expires_at.timestamp()),
            "session": client_secrets.minted_session_object(row),
        }
    )
