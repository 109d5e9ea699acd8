"""A recording keeps the call's wall-clock timeline, through a real daphne and a real WebSocket client.

Two ways a call loses time in its recording: the caller's frames stop arriving for a while (the engine
is fed silence: that time must be marked as a gap, not passed off as the caller's audio), and an engine
that cannot keep up makes fewer steps than the call has periods (a 16 s call was recorded as 5 s).
Either way the recording must last as long as the call, within a frame or two, with the gaps named.
"""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from websockets.sync.client import connect

from tests.live_server import live_server_env, run_live_server
from webapp.accounts.services import apikey_create
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

pytestmark = pytest.mark.django_db(transaction=True)

RATE, FRAME, PERIOD_S = 24_000, 1920, 0.08
TWO_FRAMES_S = 2 * PERIOD_S


def frame(index: int) -> str:
    t = (np.arange(FRAME) + index * FRAME) / RATE
    return base64.b64encode((0.3 * np.sin(2 * np.pi * 300 * t) * 32767).astype("<i2").tobytes()).decode()


def send_paced(ws, seconds: float, first_index: int = 0) -> int:
    """Real-time 80 ms frames for ``seconds``, as a microphone sends them; returns the next frame index."""
    count = round(seconds / PERIOD_S)
    start = time.monotonic()
    for k in range(count):
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": frame(first_index + k)}))
        time.sleep(max(0.0, start + (k + 1) * PERIOD_S - time.monotonic()))
    return first_index + count


def until(ws, event_type: str, timeout_s: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        event = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        assert event["type"] != "error" or event["error"]["code"] == "input_backpressure", event
        if event["type"] == event_type:
            return event


def speak_pause_speak(ws) -> None:
    """2 s of speech, 3 s in which the caller's frames stop arriving (a stalled uplink; the socket stays
    open), 2 s more."""
    index = send_paced(ws, 2.0)
    time.sleep(3.0)
    send_paced(ws, 2.0, index)


def call(server, user_or_name, script) -> tuple[str, float]:
    """Open a call, run ``script(ws)`` (which sends the audio), hang up; (session id, the call's wall time)."""
    user = user_or_name
    if isinstance(user, str):
        user = get_user_model().objects.create_user(username=user, password="pw-for-tests-only")
    key = apikey_create(user=user, name="wall clock")[1]
    with connect(
        f"{server.ws_url}/v1/realtime?model=echo", additional_headers={"Authorization": f"Bearer {key}"}
    ) as ws:
        session_id = until(ws, "session.created")["session"]["id"]
        started = time.monotonic()  # the recording begins with the first audio
        script(ws)
        ws.send(json.dumps({"type": "session.close"}))
        until(ws, "session.closed")
        return session_id, time.monotonic() - started


def processed(session_id: str, timeout_s: float = 60.0) -> tuple[Recording, dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        recording = Recording.objects.filter(session_id=session_id).first()
        if recording is not None and recording.status == Recording.Status.READY:
            break
        assert time.monotonic() < deadline, recording and (recording.status, recording.status_reason)
        time.sleep(0.2)
    timeline = json.loads(recordings_storage().open(recording.files["timeline"]).read())
    return recording, timeline


@pytest.fixture(scope="module")
def echo_server(django_db_setup, django_db_blocker):
    with run_live_server(django_db_blocker, live_server_env("echo")) as server:
        yield server


@pytest.fixture(scope="module")
def slow_engine_server(django_db_setup, django_db_blocker):
    """An engine that takes 200 ms over each 80 ms step: the host cannot keep up, for the whole call."""
    with run_live_server(django_db_blocker, live_server_env("echo", PARLEY_TEST_ECHO_SLOW_TICK_MS="200")) as server:
        yield server


def test_frames_that_stop_arriving_mid_call_are_kept_as_marked_silence(echo_server):
    session_id, wall_s = call(echo_server, "pausing-caller", speak_pause_speak)
    recording, timeline = processed(session_id)
    assert recording.duration_s == pytest.approx(wall_s, abs=TWO_FRAMES_S)
    gaps = [m for m in timeline["markers"] if m["kind"] == "gap" and m["cause"] == "no_caller_audio"]
    assert any(g["silence_s"] == pytest.approx(3.0, abs=0.3) and g["t"] == pytest.approx(2.0, abs=0.3) for g in gaps), (
        timeline["markers"]
    )


def test_an_engine_that_cannot_keep_up_still_gives_a_recording_as_long_as_the_call(slow_engine_server):
    session_id, wall_s = call(slow_engine_server, "slow-engine-caller", lambda ws: send_paced(ws, 5.0))
    recording, timeline = processed(session_id)
    # Today's recording was the engine's steps end to end: 5 s of call at one step per 200 ms made 2 s.
    assert recording.duration_s == pytest.approx(wall_s, abs=TWO_FRAMES_S)
    behind = [m for m in timeline["markers"] if m["kind"] == "gap" and m["cause"] == "engine_behind"]
    assert sum(m["silence_s"] for m in behind) > 0.4 * wall_s
