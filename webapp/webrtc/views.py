"""``POST /v1/realtime/calls``: a caller's SDP offer in, our SDP answer out (OpenAI's GA WebRTC flow).

The body is the offer (``Content-Type: application/sdp``), or a form with ``sdp`` and an optional
``session`` (JSON, applied as the first ``session.update``) as OpenAI's unified interface sends.
Credentials: ``Authorization: Bearer`` with an API key or a client secret (``conversations.client_secrets.
realtime_identity``; a secret's session is applied and fixed by the consumer), or the session cookie of a signed-in page together with its CSRF token. Answers 201 with the answer SDP
and ``Location: /v1/realtime/calls/<call id>``; refusals are JSON ``{"error": {...}}`` in the realtime
error shape, with the status a client expects (400, 401, 403, 415, 429; 503 while this web process is at
the load it can carry, ``common.loop_load``).
"""

from __future__ import annotations

import json
import logging

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from webapp.common import loop_load, throttling
from webapp.conversations.client_secrets import realtime_identity
from webapp.webrtc.call import RtcCall
from webapp.webrtc.ice import server_ice_servers

logger = logging.getLogger(__name__)

MAX_OFFER_BYTES = 64 * 1024  # an offer is a few kB; a browser's with many candidates stays far below


def _refusal(status: int, code: str, message: str, *, error_type: str = "invalid_request_error") -> JsonResponse:
    body = {"error": {"type": error_type, "code": code, "message": message, "param": None}}
    return JsonResponse(body, status=status)


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    return raw.strip() or None if scheme.lower() == "bearer" else None


def _offer_and_session(request: HttpRequest) -> tuple[str, dict | None]:
    """The offer SDP and an optional session configuration; ValueError says what is wrong."""
    content_type = request.content_type or ""
    if content_type == "application/sdp":
        return request.body.decode("utf-8"), None
    if content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
        sdp = request.POST.get("sdp")
        if not sdp:
            raise ValueError("The form has no 'sdp' field.")
        raw_session = request.POST.get("session")
        session = json.loads(raw_session) if raw_session else None
        if session is not None and not isinstance(session, dict):
            raise ValueError("'session' must be a JSON object.")
        return sdp, session
    raise TypeError(content_type)


@csrf_exempt  # a bearer needs no CSRF token; the cookie path checks it below
@require_POST
async def realtime_calls(request: HttpRequest) -> HttpResponse:
    if len(request.body) > MAX_OFFER_BYTES:
        return _refusal(413, "offer_too_large", f"The offer is larger than {MAX_OFFER_BYTES} bytes.")
    if not (load := loop_load.process_load()).admits():  # before any credential lookup, as for a socket
        return _refusal(503, "resource_exhausted", load.refusal_message(), error_type="rate_limit_error")
    ip = throttling.client_ip(request.scope)
    user, api_key_id, client_secret = None, None, None
    if (raw := _bearer(request)) is not None:
        if refusal := await throttling.key_refusal(ip):
            return _refusal(429, "rate_limit_exceeded", refusal.message, error_type="rate_limit_error")
        identity = await database_sync_to_async(realtime_identity)(raw=raw)
        if identity is None:
            await throttling.record_key_failure(ip)
            message = "This API key is not valid: it is mistyped, revoked, or its user is deactivated."
            return _refusal(401, "invalid_api_key", message)
        user, api_key_id, client_secret = identity.user, identity.api_key_id, identity.client_secret
    else:
        user = await request.auser()
        if not user.is_authenticated:
            return _refusal(401, "forbidden", "Authentication required: log in or send an API key.")
        # A page of another site must not place calls with the caller's cookie.
        if CsrfViewMiddleware(lambda r: None).process_view(request, None, (), {}) is not None:
            return _refusal(403, "forbidden", "The CSRF check failed: send the page's CSRF token.")
    if refusal := await throttling.connect_refusal(user_id=user.pk, api_key_id=api_key_id):
        return _refusal(429, "rate_limit_exceeded", refusal.message, error_type="rate_limit_error")
    try:
        offer, form_session = _offer_and_session(request)
    except TypeError:
        return _refusal(415, "unsupported_media_type", "Send the SDP offer as application/sdp.")
    except (ValueError, UnicodeDecodeError) as exc:
        return _refusal(400, "invalid_offer", str(exc) or "The offer could not be read.")
    call = RtcCall(
        user=user,
        api_key_id=api_key_id,
        query_string=request.META.get("QUERY_STRING", "").encode("latin-1"),
        client=request.scope.get("client"),
        initial_session=form_session,
        client_secret=client_secret,
        ice_servers=server_ice_servers(),
    )
    try:
        answer = await call.answer(offer)
    except Exception as exc:  # aiortc raises ValueError and others for an SDP it cannot use
        await call.close()
        logger.info("webrtc.offer_refused", extra={"why": str(exc)[:200]})
        return _refusal(400, "invalid_offer", f"The SDP offer could not be answered: {str(exc)[:200]}")
    logger.info("webrtc.call_answered", extra={"call_id": call.id, "user_id": user.pk})
    response = HttpResponse(answer, status=201, content_type="application/sdp")
    response["Location"] = f"/v1/realtime/calls/{call.id}"
    return response
