"""Post-processing says which step runs (the review page and the list poll ``stage``), and a recording whose
analysis fails still plays."""

from __future__ import annotations

import pytest
from django.urls import reverse

from webapp.recordings import services, tasks
from webapp.recordings.models import Recording

from .conftest import record_raw_call

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_step_is_named_while_it_runs_and_none_once_done(
    client, recorder, media_dir, make_recording, django_user_model, monkeypatch, settings
):
    settings.PARLEY_TRANSCRIBER = "pocketsphinx"  # the caller's track is a tone: no words, but the step runs
    seen: list[str] = []
    update = tasks._update

    def watching(recording, **fields):
        update(recording, **fields)
        if fields.get("stage"):  # what the status poll would read at that moment, from the database
            seen.append(Recording.objects.get(pk=recording.pk).stage)

    monkeypatch.setattr(tasks, "_update", watching)
    owner = django_user_model.objects.create_user(username="owner", password="x")
    recording = make_recording(owner, session_id="sess_stages")
    record_raw_call(recorder, "sess_stages", steps=30)
    services.recording_close(session_id="sess_stages", reason="client_close")
    recording.refresh_from_db()
    assert recording.status == Recording.Status.READY, recording.status_reason
    assert seen == [
        "reading the raw recording",
        "rendering the audio",
        "transcribing the caller",
        "storing the files",
        "measuring turn-taking",
        "measuring the echo",
    ]
    assert recording.stage == ""
    client.force_login(owner)
    status = client.get(reverse("recording-status", args=[recording.pk])).json()
    assert status["stage"] == "" and status["echo_flagged"] is False


def test_a_processing_recording_shows_its_step_on_its_page(client, make_recording, django_user_model):
    owner = django_user_model.objects.create_user(username="owner", password="x")
    recording = make_recording(owner, session_id="sess_busy")
    Recording.objects.filter(pk=recording.pk).update(status="processing", progress=0.3, stage="measuring the echo")
    client.force_login(owner)
    body = client.get(reverse("recording-detail", args=[recording.pk])).content.decode()
    assert '<span id="progress-label" class="muted">measuring the echo</span>' in body
    assert client.get(reverse("recording-status", args=[recording.pk])).json()["stage"] == "measuring the echo"


@pytest.mark.parametrize("analysis", ["echo_of_call", "transcription"])
def test_a_recording_whose_analysis_fails_still_plays(
    client, recorder, media_dir, make_recording, django_user_model, monkeypatch, settings, analysis
):
    def broken(*args, **kwargs):
        raise RuntimeError(f"{analysis} fell over")

    if analysis == "echo_of_call":
        monkeypatch.setattr(tasks, "echo_of_call", broken)
    else:
        settings.PARLEY_TRANSCRIBER = "pocketsphinx"
        monkeypatch.setattr(tasks.api, "transcribe_speech", broken)
    owner = django_user_model.objects.create_user(username="owner", password="x")
    recording = make_recording(owner, session_id="sess_broken")
    record_raw_call(recorder, "sess_broken", steps=30)
    services.recording_close(session_id="sess_broken", reason="client_close")
    recording.refresh_from_db()
    assert recording.status == Recording.Status.READY and recording.playable and recording.stage == ""
    if analysis == "echo_of_call":
        assert recording.echo_leak == {"error": "RuntimeError: echo_of_call fell over"}
        assert recording.turn_taking and "error" not in recording.turn_taking
    client.force_login(owner)
    body = client.get(reverse("recording-detail", args=[recording.pk])).content.decode()
    assert 'id="wave-caller"' in body and 'id="play"' in body
