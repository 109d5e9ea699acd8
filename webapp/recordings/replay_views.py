"""A video call's frames, replays of a call, and the compare view of a call and its replay.

Every route looks recordings up through ``selectors.recording_get_for`` (another user's id is a 404).
"""

from __future__ import annotations

import json

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.urls import reverse

from webapp.common.errors import ApplicationError
from webapp.personas.selectors import persona_list_for, voice_list_for
from webapp.recordings.models import Recording
from webapp.recordings.replay import replay_start
from webapp.recordings.selectors import recording_get_for
from webapp.recordings.storage import recordings_storage

IMAGE_TYPES = {b"\xff\xd8": "image/jpeg", b"\x89P": "image/png"}
COMPARED = ("turn_taking", "echo_leak")


class ReplayForm(forms.Form):
    """What a replay changes; empty fields keep the source call's."""

    persona = forms.TypedChoiceField(required=False, coerce=int, empty_value=None, label="Persona")
    voice = forms.CharField(
        required=False, max_length=100, label="Voice", widget=forms.TextInput(attrs={"list": "voice-names"})
    )
    checkpoint = forms.CharField(required=False, max_length=500, label="Checkpoint (server path or hub id)")
    engine = forms.ChoiceField(required=False, choices=[("", "the call's"), ("moshi", "moshi"),
                               ("personaplex", "personaplex"), ("minicpmo", "minicpmo"), ("echo", "echo")])  # fmt: skip
    pace = forms.ChoiceField(choices=[("fast", "as fast as the engine goes"), ("original", "the caller's own pace")])
    greedy = forms.TypedChoiceField(required=False, coerce=lambda v: v == "on", empty_value=None,
                                    choices=[("", "the call's decoding"), ("on", "greedy"), ("off", "sampling")])  # fmt: skip

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        personas = persona_list_for(user=user)
        self.fields["persona"].choices = [("", "the call's"), *((p.pk, p.name) for p in personas)]
        self.voices = [v.name for v in voice_list_for(user=user, usable_only=True)]


def review_extras(user, recording: Recording) -> dict:
    """What the review page adds for video and replays: the frames' URLs, the replay form, linked replays."""
    frames_base = reverse("recording-frame", args=[recording.pk, 0])[:-1] if "frames_index" in recording.files else ""
    replays = list(recording.replays.filter(user=user).order_by("-started_at")[:20])
    return {"frames_base": frames_base, "replay_form": ReplayForm(user=user), "replays": replays}


@login_required
def recording_frame(request: HttpRequest, recording_id: int, index: int) -> HttpResponse:
    """The ``index``-th camera frame of a video call (frames.json says when it was seen)."""
    recording = recording_get_for(user=request.user, recording_id=recording_id)
    if "frames_index" not in recording.files:
        raise Http404("This call kept no camera frames.")
    storage = recordings_storage()
    with storage.open(recording.files["frames_index"], "rb") as f:
        frames = json.loads(f.read())["frames"]
    if not 0 <= index < len(frames):
        raise Http404("No such frame.")
    item = frames[index]
    with storage.open(recording.files["frames"], "rb") as f:
        f.seek(item["offset"])
        data = f.read(item["size"])
    response = HttpResponse(data, content_type=IMAGE_TYPES.get(data[:2], "application/octet-stream"))
    response["Cache-Control"] = "private, max-age=3600"
    return response


@login_required
def recording_replay(request: HttpRequest, recording_id: int) -> HttpResponse:
    """POST: replay this call with the form's changes; the new recording's page follows its progress."""
    source = recording_get_for(user=request.user, recording_id=recording_id)
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    form = ReplayForm(request.POST, user=request.user)
    if form.is_valid():
        data = form.cleaned_data
        try:
            row = replay_start(user=request.user, source=source, persona_id=data["persona"], voice=data["voice"],
                               checkpoint=data["checkpoint"], engine=data["engine"], pace=data["pace"],
                               greedy=data["greedy"])  # fmt: skip
        except ApplicationError as exc:
            form.add_error(None, exc.message)
        else:
            return redirect(reverse("recording-compare", args=[source.pk, row.pk]))
    return render(request, "recordings/replay_refused.html", {"recording": source, "form": form}, status=400)


@login_required
def recording_compare(request: HttpRequest, first_id: int, second_id: int) -> HttpResponse:
    """Two agent tracks against the one caller track, side by side, with their metrics next to each other."""
    first = recording_get_for(user=request.user, recording_id=first_id)
    second = recording_get_for(user=request.user, recording_id=second_id)
    sides = [_side(first), _side(second)]
    names = sorted({key for side in sides for key, value in side["metrics"].items() if not isinstance(value, dict)})
    rows = [(name, [side["metrics"].get(name, "–") for side in sides]) for name in names]
    return render(request, "recordings/compare.html", {"sides": sides, "rows": rows, "first": first, "second": second})


def _side(recording: Recording) -> dict:
    metrics: dict = {"duration_s": recording.duration_s}
    for field in COMPARED:
        for key, value in (getattr(recording, field) or {}).items():
            metrics[f"{field}.{key}"] = value
    urls = {kind: reverse("recording-file", args=[recording.pk, kind]) for kind in recording.files}
    return {
        "recording": recording,
        "metrics": metrics,
        "urls": urls,
        "status_url": reverse("recording-status", args=[recording.pk]),
    }
