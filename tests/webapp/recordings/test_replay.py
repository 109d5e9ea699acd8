"""Replays from the web tier (eager Celery, the embedded default): a recorded call replayed through
``inference.api.replay_call`` on the echo engine becomes a recording of its own, linked to its source, with
the same post-processing; the compare view puts both side by side; bad requests are refused clearly."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from webapp.common.errors import ApplicationError
from webapp.recordings import services
from webapp.recordings.models import Recording
from webapp.recordings.replay import replay_start
from webapp.recordings.storage import recordings_storage

from .conftest import record_raw_call

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_replay_is_a_linked_recording_with_the_same_processing(recorder, media_dir, make_recording, client):
    source = make_recording(session_id="sess_source")
    record_raw_call(recorder, "sess_source", steps=30)
    services.recording_close(session_id="sess_source", reason="client_close")
    source.refresh_from_db()
    assert source.status == Recording.Status.READY and "steps" in source.files

    replay = replay_start(user=source.user, source=source, pace="fast")
    replay.refresh_from_db()
    assert replay.status == Recording.Status.READY, replay.status_reason
    assert replay.source_id == source.pk and replay.replay["steps"] == 30 and replay.replay["pace"] == "fast"
    assert set(source.files) <= set(replay.files) and replay.turn_taking and replay.echo_leak
    assert replay.duration_s == pytest.approx(30 * 0.08, abs=0.1)  # fast: the 30 steps laid as they ran
    with recordings_storage().open(replay.files["wav"]) as f:
        stereo, rate = sf.read(io.BytesIO(f.read()))
    spectrum = np.abs(np.fft.rfft(stereo[:rate, 0]))
    assert abs(np.argmax(spectrum) * rate / min(len(stereo), rate) - 300) < 5  # the source's caller track, again
    assert np.abs(stereo[:, 1]).max() > 0.05  # the echo engine answered it

    client.force_login(source.user)
    page = client.get(f"/recordings/compare/{source.pk}/{replay.pk}/")
    assert page.status_code == 200 and b"turn_taking." in page.content and page.content.count(b"compare-side") >= 2
    detail = client.get(f"/recordings/{replay.pk}/")
    assert b"A replay of" in detail.content and b"sess_source" in detail.content


def test_a_replay_is_refused_clearly(recorder, media_dir, make_recording, client):
    source = make_recording(session_id="sess_nosteps")
    with pytest.raises(ApplicationError, match="cannot be replayed"):
        replay_start(user=source.user, source=source)
    source.files = {"steps": "x"}
    source.save()
    with pytest.raises(ApplicationError, match="No such persona"):
        replay_start(user=source.user, source=source, persona_id=999_999)
    client.force_login(source.user)
    refused = client.post(f"/recordings/{source.pk}/replay", {"pace": "sideways"})
    assert refused.status_code == 400
    assert client.get(f"/recordings/{source.pk}/replay").status_code == 405
