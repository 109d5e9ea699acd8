"""The call page. Thin: it renders choices and the default engine's capabilities; the call itself
runs in the browser (static/call/) against the realtime endpoint."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from inference.api import capabilities_preview, warm_start_status
from inference.contracts import ParleyError
from webapp.personas.selectors import persona_list_for, voice_list_for

DEFAULT_PERSONA = "You are a friendly, curious conversation partner. Keep your answers short."


@login_required
def call_page(request: HttpRequest) -> HttpResponse:
    personas = list(persona_list_for(user=request.user))
    try:
        # Lets the page show the demo / echo banner before the first call starts.
        capabilities, unavailable = capabilities_preview(), None
    except ParleyError as exc:  # a remote inference service that is down: say so, still render
        capabilities, unavailable = None, exc.message
    context = {
        "personas": personas,
        "voices": list(voice_list_for(user=request.user, usable_only=True)),  # ready: not pending, failed, disabled
        "default_persona": personas[0].instructions if personas else DEFAULT_PERSONA,
        "capabilities": capabilities,
        "inference_unavailable": unavailable,
        "warm_start": warm_start_status(),
        # STUN/TURN for WebRTC calls (PARLEY_ICE_SERVERS; credentials included: the browser needs them)
        "ice_servers": list(settings.PARLEY_ICE_SERVERS),  # the page waits while it says warming (static/call/warm-start.js)
    }
    return render(request, "calls/call.html", context)


@login_required
def warm_start(request: HttpRequest) -> JsonResponse:
    """The warm start's state, which the call page polls while the agent is being made ready."""
    return JsonResponse(warm_start_status())
