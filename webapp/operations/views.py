"""Staff-only occupancy views. Thin: read ``inference.api.occupancy()``, present, render.

Async views, because the facade is async; ``request.auser()`` keeps the ORM off the event loop.
"""

from __future__ import annotations

import re
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.views.decorators.http import require_GET, require_POST

from inference import api
from inference.contracts import ParleyError
from webapp.operations.presenters import occupancy_payload, worker_rows
from webapp.operations.selectors import usernames_for_slots

# Session ids are server-made tokens; anything else in the URL is not worth a facade call.
SESSION_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


async def _refusal(request: HttpRequest, *, as_json: bool = False) -> HttpResponse | None:
    """None for an active staff user; otherwise the response that refuses the request."""
    user = await request.auser()
    if user.is_authenticated and user.is_active and user.is_staff:
        return None
    if as_json:
        status = 403 if user.is_authenticated else 401
        return JsonResponse({"error": {"code": "forbidden", "message": "staff only"}}, status=status)
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
    return HttpResponse("Staff only.", status=403, content_type="text/plain")


async def _context() -> dict[str, Any]:
    try:
        snapshots = await api.occupancy()
    except ParleyError as exc:  # the inference service is down or restarting: show that, not a 500
        return {"workers": [], "queue_length": 0, "unavailable": exc.message}
    # Sync in the facade (a socket round trip in remote mode): keep it off the event loop.
    preview = await sync_to_async(api.capabilities_preview)()
    # The engine's chunk period is its real-time budget: ticks above it fall behind the clock.
    budgets = {preview["engine"]: float(preview["chunk_period_ms"])} if "chunk_period_ms" in preview else {}
    usernames = await sync_to_async(usernames_for_slots)(snapshots=snapshots)
    return {
        "workers": worker_rows(snapshots, budgets_ms=budgets, usernames=usernames),
        "queue_length": sum(s.queue_length for s in snapshots),
    }


@require_GET
async def occupancy_page(request: HttpRequest) -> HttpResponse:
    if refusal := await _refusal(request):
        return refusal
    return TemplateResponse(request, "operations/occupancy.html", await _context())


@require_GET
async def occupancy_fragment(request: HttpRequest) -> HttpResponse:
    """Just the workers block, which the page polls and swaps in (one rendering path for both)."""
    if refusal := await _refusal(request):
        return refusal
    return TemplateResponse(request, "operations/_workers.html", await _context())


@require_GET
async def occupancy_json(request: HttpRequest) -> HttpResponse:
    if refusal := await _refusal(request, as_json=True):
        return refusal
    try:
        snapshots = await api.occupancy()
    except ParleyError as exc:
        return JsonResponse({"error": {"code": exc.code, "message": exc.message}}, status=503)
    return JsonResponse(occupancy_payload(snapshots))


@require_POST
async def session_end(request: HttpRequest, session_id: str) -> HttpResponse:
    if refusal := await _refusal(request):
        return refusal
    # Seeing the console is staff; ending someone's call is an explicit grant (superusers have it).
    if not await sync_to_async((await request.auser()).has_perm)("accounts.end_session"):
        return HttpResponse("Ending sessions needs the accounts.end_session permission.", status=403)
    if not SESSION_ID.match(session_id):
        messages.error(request, "That is not a session id.")
        return redirect("operations:occupancy")
    try:
        ended = await api.end_session(session_id, reason="admin_ended")
    except ParleyError as exc:
        messages.error(request, f"Could not end session {session_id}: {exc.message}")
        return redirect("operations:occupancy")
    if ended:
        messages.info(request, f"Session {session_id} ended.")
    else:
        messages.warning(request, f"Session {session_id} was not running any more.")
    return redirect("operations:occupancy")
