"""Post-processing measures each call's turn-taking, stores it on the recording and shows it on the review page."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from webapp.recordings import services, tasks
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

from .conftest import record_raw_call

pytestmark = pytest.mark.django_db(transaction=True)


def processed(recorder, make_recording, owner, session_id: str) -> Recording:
    recording = make_recording(owner, session_id=session_id)
    record_raw_call(recorder, session_id, steps=40)  # both sides sound for the whole 3.2 s, one barge-in
    services.recording_close(session_id=session_id, reason="client_close")
    recording.refresh_from_db()
    return recording


def test_a_processed_call_stores_its_turn_taking_and_the_review_page_shows_it(
    client, recorder, media_dir, make_recording, django_user_model
):
    owner = django_user_model.objects.create_user(username="owner", password="x")
    recording = processed(recorder, make_recording, owner, "sess_measured")
    assert recording.status == Recording.Status.READY, recording.status_reason
    metrics = recording.turn_taking
    assert metrics["caller_talk_s"] == pytest.approx(3.2, abs=0.04)
    assert metrics["agent_talk_s"] == pytest.approx(3.2, abs=0.04)
    assert metrics["talk_ratio"] == pytest.approx(0.5, abs=0.01)
    timeline = json.loads(recordings_storage().open(recording.files["timeline"]).read())
    barge_ins = [m["t"] for m in timeline["markers"] if m["kind"] == "barge_in"]
    assert metrics["engine_barge_ins"] == barge_ins and len(barge_ins) == 1
    client.force_login(owner)
    body = client.get(reverse("recording-detail", args=[recording.pk])).content.decode()
    assert 'id="turn-taking"' in body and "Response latency" in body
    assert "agent share 0.50" in body


def test_a_call_whose_measurement_fails_still_plays_with_the_reason(
    client, recorder, media_dir, make_recording, django_user_model, monkeypatch
):
    def broken(*args, **kwargs):
        raise ValueError("the detector fell over")

    monkeypatch.setattr(tasks, "measure", broken)
    owner = django_user_model.objects.create_user(username="owner", password="x")
    recording = processed(recorder, make_recording, owner, "sess_unmeasured")
    assert recording.status == Recording.Status.READY and recording.playable
    assert recording.turn_taking == {"error": "ValueError: the detector fell over"}
    client.force_login(owner)
    body = client.get(reverse("recording-detail", args=[recording.pk])).content.decode()
    assert "Not measured: ValueError: the detector fell over" in body and 'id="wave-caller"' in body
