"""Persona and voice pages. Every lookup goes through ``selectors`` (owner + shared; others' private rows only
with an explicit permission): another user's private row answers 404 exactly like a missing one, on every route."""

from __future__ import annotations

import io

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_POST

from inference import api
from webapp.accounts.permissions import DISABLE_VOICE, may
from webapp.personas import services
from webapp.personas.forms import PersonaForm, VoiceUploadForm
from webapp.personas.models import Persona, Voice
from webapp.personas.selectors import can_edit, persona_get_for, persona_list_for, voice_get_for, voice_list_for
from webapp.personas.uploads import UploadTooBig, limit_upload

PREVIEW_SECONDS = 5.0
CONSENT_SESSION_KEY = "voice_consent"


def _persona_or_404(request: HttpRequest, pk: int, *, edit: bool = False) -> Persona:
    persona = persona_get_for(user=request.user, persona_id=pk, include_archived=True)
    if persona is None:
        raise Http404("No such persona.")
    if edit and not can_edit(user=request.user, row=persona):
        raise PermissionDenied("Editing another user's or a shared persona takes the change_persona permission.")
    return persona


def _voice_or_404(request: HttpRequest, pk: int) -> Voice:
    voice = voice_get_for(user=request.user, voice=pk)
    if voice is None:
        raise Http404("No such voice.")
    return voice


# ---- personas -------------------------------------------------------------------------------------------


@login_required
@require_GET
def persona_list(request: HttpRequest) -> HttpResponse:
    show_archived = request.GET.get("archived") == "1"
    personas = persona_list_for(user=request.user, include_archived=show_archived)
    rows = [(p, can_edit(user=request.user, row=p)) for p in personas]
    return render(request, "personas/persona_list.html", {"rows": rows, "show_archived": show_archived})


@login_required
def persona_create(request: HttpRequest) -> HttpResponse:
    form = PersonaForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        shared = form.cleaned_data.get("shared", False)
        persona = services.persona_create(
            owner=None if shared else request.user,
            name=form.cleaned_data["name"],
            instructions=form.cleaned_data["instructions"],
            default_voice=form.cleaned_data["default_voice"],
            by=request.user,
        )
        messages.info(request, f"Persona {persona.name!r} created (version 1).")
        return redirect("personas:persona-versions", pk=persona.pk)
    return render(request, "personas/persona_form.html", {"form": form, "persona": None})


@login_required
def persona_edit(request: HttpRequest, pk: int) -> HttpResponse:
    persona = _persona_or_404(request, pk, edit=True)
    form = PersonaForm(request.POST or None, instance=persona, user=request.user)
    if request.method == "POST" and form.is_valid():
        if "shared" in form.cleaned_data:
            persona.owner = None if form.cleaned_data["shared"] else (persona.owner or request.user)
        services.persona_edit(
            persona=persona,
            name=form.cleaned_data["name"],
            instructions=form.cleaned_data["instructions"],
            default_voice=form.cleaned_data["default_voice"],
            by=request.user,
        )
        messages.info(request, f"Persona {persona.name!r} saved (version {persona.version}).")
        return redirect("personas:persona-versions", pk=persona.pk)
    return render(request, "personas/persona_form.html", {"form": form, "persona": persona})


@login_required
@require_POST
def persona_archive(request: HttpRequest, pk: int) -> HttpResponse:
    persona = _persona_or_404(request, pk, edit=True)
    archived = request.POST.get("archived", "1") == "1"
    services.persona_set_archived(persona=persona, archived=archived)
    messages.info(request, f"Persona {persona.name!r} {'archived' if archived else 'restored'}.")
    return redirect("personas:persona-list")


@login_required
@require_GET
def persona_versions(request: HttpRequest, pk: int) -> HttpResponse:
    persona = _persona_or_404(request, pk)
    versions = persona.versions.select_related("created_by", "default_voice")
    context = {"persona": persona, "versions": versions, "editable": can_edit(user=request.user, row=persona)}
    return render(request, "personas/persona_versions.html", context)


# ---- voices ---------------------------------------------------------------------------------------------


@login_required
@require_GET
def voice_list(request: HttpRequest) -> HttpResponse:
    voices = voice_list_for(user=request.user)
    return render(request, "personas/voice_list.html", {"voices": voices})


@csrf_exempt  # the upload limit must be installed before CSRF checking reads the body; checked right below
@login_required
def voice_new(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        try:
            handler = limit_upload(request, per_file=int(api.voice_limits()["max_bytes"]), files=2)
        except UploadTooBig as exc:
            return _upload_refused(request, str(exc), status=413)
        return _voice_new_checked(request, handler)
    return _voice_new_checked(request, None)


@csrf_protect
def _voice_new_checked(request: HttpRequest, handler) -> HttpResponse:
    consent_sentence, phrase = request.session.get(CONSENT_SESSION_KEY) or (None, None)
    if request.method == "POST":
        form = VoiceUploadForm(request.POST, request.FILES, user=request.user)
        if handler is not None and handler.exceeded:
            return _upload_refused(request, "The upload is too big: at most 10 MB per file are accepted.", 413)
        if form.is_valid() and consent_sentence:
            shared = form.cleaned_data.get("shared", False)
            clip, consent = form.cleaned_data["clip"], form.cleaned_data["consent"]
            try:
                voice = services.voice_create_clone(
                    owner=None if shared else request.user,
                    by=request.user,
                    name=form.cleaned_data["name"].strip(),
                    clip=clip.read(),  # the client's file names are not used: what is stored is named by its content
                    consent=services.Consent(audio=consent.read(), sentence=consent_sentence, phrase=phrase),
                )
            except services.VoiceError as exc:
                form.add_error(None, str(exc))
            else:
                request.session.pop(CONSENT_SESSION_KEY, None)  # a phrase is read once
                if _wants_json(request):
                    return JsonResponse({"id": voice.pk, "url": reverse("personas:voice-detail", args=[voice.pk])})
                return redirect("personas:voice-detail", pk=voice.pk)
        elif form.is_valid():
            form.add_error(None, "The consent step expired: reload the page and read the new sentence.")
        if _wants_json(request):
            return JsonResponse({"errors": _form_errors(form)}, status=400)
    else:
        form = VoiceUploadForm(user=request.user)
        consent_sentence, phrase = services.consent_sentence(user=request.user)
        request.session[CONSENT_SESSION_KEY] = (consent_sentence, phrase)
    context = {"form": form, "consent_sentence": consent_sentence, "limits": api.voice_limits()}
    return render(request, "personas/voice_new.html", context, status=400 if request.method == "POST" else 200)


def _upload_refused(request: HttpRequest, message: str, status: int) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse({"errors": [message]}, status=status)
    return HttpResponse(message, status=status, content_type="text/plain")


def _wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def _form_errors(form) -> list[str]:
    return [f"{'' if field == '__all__' else field + ': '}{e}" for field, errs in form.errors.items() for e in errs]


@login_required
@require_GET
def voice_detail(request: HttpRequest, pk: int) -> HttpResponse:
    voice = _voice_or_404(request, pk)
    context = {
        "voice": voice,
        "prompts": voice.prompts.all(),
        "may_disable": may(request.user, DISABLE_VOICE),
        "can_change": can_edit(user=request.user, row=voice),
    }
    return render(request, "personas/voice_detail.html", context)


@login_required
@require_GET
def voice_status(request: HttpRequest, pk: int) -> JsonResponse:
    voice = _voice_or_404(request, pk)
    return JsonResponse(
        {
            "id": voice.pk,
            "name": voice.name,
            "status": voice.status,
            "stage": voice.progress_stage,
            "percent": voice.progress_percent,
            "reason": voice.failure_reason,
            "duration_s": voice.duration_s,
            "prompts": [p.family for p in voice.prompts.all()],
        }
    )


@login_required
@require_GET
def voice_preview(request: HttpRequest, pk: int) -> HttpResponse:
    """The first seconds of the processed clip as a 16-bit wav (what the engine hears, a little of it)."""
    import soundfile

    voice = _voice_or_404(request, pk)
    if not voice.processed_audio:
        raise Http404("This voice has no audio to preview.")
    with voice.processed_audio.open("rb") as handle:
        pcm, rate = soundfile.read(handle, dtype="float32", frames=int(PREVIEW_SECONDS * 24_000))
    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, rate, format="WAV", subtype="PCM_16")
    buffer.seek(0)
    return FileResponse(buffer, content_type="audio/wav", filename=f"voice-{voice.pk}-preview.wav")


def _voice_to_change(request: HttpRequest, pk: int) -> Voice:
    voice = _voice_or_404(request, pk)
    if not can_edit(user=request.user, row=voice):
        raise PermissionDenied("Only the voice's owner (or staff) may change it.")
    return voice


@login_required
@require_POST
def voice_retry(request: HttpRequest, pk: int) -> HttpResponse:
    voice = _voice_to_change(request, pk)
    try:
        services.voice_retry(voice=voice)
    except services.VoiceError as exc:
        messages.error(request, str(exc))
    return redirect("personas:voice-detail", pk=voice.pk)


@login_required
@require_POST
def voice_delete(request: HttpRequest, pk: int) -> HttpResponse:
    voice = _voice_to_change(request, pk)
    try:
        services.voice_delete(voice=voice)
    except services.VoiceError as exc:
        messages.error(request, str(exc))
        return redirect("personas:voice-detail", pk=voice.pk)
    messages.info(request, f"Voice {voice.name!r} deleted.")
    return redirect("personas:voice-list")


@login_required
@require_POST
def voice_disable(request: HttpRequest, pk: int) -> HttpResponse:
    # The console's own check (operations.disable_voice), and like the console it reaches any voice by id.
    if not may(request.user, DISABLE_VOICE):
        raise PermissionDenied("Disabling a voice takes the disable_voice permission.")
    voice = Voice.objects.filter(pk=pk).first()
    if voice is None:
        raise Http404("No such voice.")
    if request.POST.get("enable") == "1":
        services.voice_enable(voice=voice)
        messages.info(request, f"Voice {voice.name!r} enabled again.")
    else:
        services.voice_disable(voice=voice, by=request.user)
        messages.info(request, f"Voice {voice.name!r} disabled: no new call may use it.")
    return redirect("personas:voice-detail", pk=voice.pk)
