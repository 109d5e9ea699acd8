"""The operations console: the live page and its actions. Each action is confirmed and audited.

Thin views: permission check (``access``), the facade call (``inference.api``), one ``AuditEntry``.
A confirmed action carries ``confirm=<its target>`` (the page sends it after the admin confirms
in a dialog), so a bare POST to an action URL does nothing but a 400.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from inference import api
from inference.contracts import ParleyError
from webapp.operations import access
from webapp.operations.models import AuditEntry
from webapp.operations.snapshot import console_snapshot
from webapp.personas.models import Voice

# Session ids and service ids are server-made tokens; anything else in a URL is not worth a facade call.
TOKEN = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


async def _refused(request: HttpRequest, permission: str, *, page: bool = False) -> HttpResponse | None:
    user = await request.auser()
    if await sync_to_async(access.may)(user, permission):
        return None
    if page and not user.is_authenticated:
        return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
    if page:
        return HttpResponse("Staff only.", status=403, content_type="text/plain")
    status = 403 if user.is_authenticated else 401
    return JsonResponse({"error": {"code": "forbidden", "message": "staff with this permission only"}}, status=status)


def _bad(message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": {"code": "invalid_request", "message": message}}, status=status)


async def _audited(
    request: HttpRequest, action: str, target: str, run: Callable[[], Awaitable[tuple[bool, str]]]
) -> JsonResponse:
    """Check the confirmation, run the action, write who/when/what, answer with the outcome."""
    if request.POST.get("confirm") != target:
        return _bad("confirm the action: send confirm=<its target>")
    try:
        done, outcome = await run()
    except ParleyError as exc:
        done, outcome = False, f"failed: {exc.message}"
    user = await request.auser()
    entry = await AuditEntry.objects.acreate(actor=user, action=action, target=target, outcome=outcome[:200])
    return JsonResponse(
        {"ok": done, "outcome": outcome, "audit": {"id": entry.pk, "at": entry.at.isoformat(), "actor": user.username}},
        status=200 if done else 409,
    )


@require_GET
async def console_page(request: HttpRequest) -> HttpResponse:
    if refusal := await _refused(request, access.VIEW_CONSOLE, page=True):
        return refusal
    audit = [entry async for entry in AuditEntry.objects.select_related("actor")[:20]]
    return TemplateResponse(request, "operations/console.html", {"snapshot": await console_snapshot(), "audit": audit})


@require_POST
async def end_session(request: HttpRequest, session_id: str) -> HttpResponse:
    if refusal := await _refused(request, access.END_SESSION):
        return refusal
    if not TOKEN.match(session_id):
        return _bad("that is not a session id")

    async def run() -> tuple[bool, str]:
        ended = await api.end_session(session_id, reason="admin_ended")
        return ended, "ended" if ended else "not running any more"

    return await _audited(request, AuditEntry.Action.END_SESSION, session_id, run)


@require_POST
async def drain_service(request: HttpRequest, service_id: str) -> HttpResponse:
    if refusal := await _refused(request, access.DRAIN_SERVICE):
        return refusal
    if not TOKEN.match(service_id):
        return _bad("that is not a service id")
    draining = request.POST.get("draining") != "0"
    action = AuditEntry.Action.DRAIN_SERVICE if draining else AuditEntry.Action.UNDRAIN_SERVICE

    async def run() -> tuple[bool, str]:
        found = await api.set_draining(service_id, draining)
        return found, ("draining" if draining else "serving") if found else "no such service"

    return await _audited(request, action, service_id, run)


@require_POST
async def admission(request: HttpRequest) -> HttpResponse:
    if refusal := await _refused(request, access.CONTROL_ADMISSION):
        return refusal
    open_ = request.POST.get("open") == "1"
    action = AuditEntry.Action.RESUME_ADMISSION if open_ else AuditEntry.Action.STOP_ADMISSION

    async def run() -> tuple[bool, str]:
        await api.set_admission(open_)
        return True, "admitting new calls" if open_ else "new calls refused"

    return await _audited(request, action, "admission", run)


@require_POST
async def disable_voice(request: HttpRequest, voice_id: str) -> HttpResponse:
    if refusal := await _refused(request, access.DISABLE_VOICE):
        return refusal
    if not voice_id.isdigit():
        return _bad("that is not a voice id")
    user = await request.auser()

    async def run() -> tuple[bool, str]:
        # The Voice model's own DISABLED state (the personas app owns it): new calls can no longer pick it.
        changed = (
            await Voice.objects.filter(pk=int(voice_id))
            .exclude(status=Voice.Status.DISABLED)
            .aupdate(status=Voice.Status.DISABLED, disabled_by=user, disabled_at=timezone.now())
        )
        if changed:
            return True, "disabled"
        exists = await Voice.objects.filter(pk=int(voice_id)).aexists()
        return False, "already disabled" if exists else "no such voice"

    return await _audited(request, AuditEntry.Action.DISABLE_VOICE, voice_id, run)
