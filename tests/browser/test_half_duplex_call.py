"""Acceptance: a half-duplex call from the browser against the unit engine (tiny MiniCPM-o checkpoint).

Chromium's fake microphone loops one espeak-ng utterance followed by 4 s of silence. The page picks
half-duplex (server_vad with OpenAI's defaults); each utterance is one committed turn, and each turn
gets one response that ends before the next utterance (max_response_s=2), so none is cancelled.
This module starts its own daphne live server and its own chromium, with its own fake microphone file.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import soundfile
from playwright.sync_api import expect

from inference import api
from tests.browser.pages import hooks, login, start_call_in_mode, wait_for, wait_for_state
from tests.live_server import run_unit_live_server
from tests.turn_audio import utterance
from webapp.recordings.models import Recording

pytestmark = pytest.mark.browser

START_TIMEOUT_MS = 90_000
TURNS_TIMEOUT_MS = 60_000
SILENCE_S = 4.0


@pytest.fixture(scope="module")
def turns_mic_browser(launch_with_fake_mic, tmp_path_factory):
    """A chromium of its own whose fake microphone loops one utterance, then silence long enough for its
    response (the suite's browser loops continuous speech)."""
    speech = utterance("Hello, can you hear me?", 48_000)
    audio = np.concatenate([speech, np.zeros(int(SILENCE_S * 48_000), np.float32)])
    wav = tmp_path_factory.mktemp("fake-mic-turns") / "turns.wav"
    soundfile.write(wav, audio, 48_000, subtype="PCM_16")
    return launch_with_fake_mic(wav)


@pytest.fixture(scope="module")
def unit_live_server(tmp_path_factory, django_db_setup, django_db_blocker):
    with run_unit_live_server(tmp_path_factory, django_db_blocker, vocoder=False) as server:
        yield server


def test_half_duplex_call_one_response_per_utterance(unit_live_server, turns_mic_browser, make_user):
    context = turns_mic_browser.new_context()
    page = context.new_page()
    make_user("turncaller")
    login(page, unit_live_server.url, "turncaller")
    start_call_in_mode(
        page,
        unit_live_server.url,
        "half_duplex",
        "half-duplex",
        query="raw=1&max_response_s=2",
        timeout_ms=START_TIMEOUT_MS,
    )
    expect(page.locator("#speech-indicator")).to_be_visible()

    wait_for(page, "p.turns.responses.length >= 2", timeout_ms=TURNS_TIMEOUT_MS)
    turns = hooks(page)["turns"]
    assert turns["speechStarted"] >= 2 and turns["committed"] >= 2, (turns, hooks(page)["eventCounts"])
    # One response per committed utterance (the newest turn's may still run), none cut off by barge-in.
    assert turns["committed"] - 1 <= len(turns["responses"]) <= turns["committed"], turns
    assert all(r["status"] in ("completed", "incomplete") for r in turns["responses"]), turns
    assert len({r["id"] for r in turns["responses"]}) == len(turns["responses"])
    assert hooks(page)["errors"] == []

    # The raw recording's event log has the mode and every turn event. Read while the call runs (the
    # recorder flushes every 0.5 s): once the call ends, post-processing removes the raw recording.
    session_id = hooks(page)["sessionId"]
    deadline = time.monotonic() + 10
    while True:
        events = api.read_recording(session_id).events
        turn_events = [e["event"] for e in events if e["k"] == "turn"]
        if turn_events.count("TurnCommitted") >= 2 and turn_events.count("ResponseStarted") >= 2:
            break
        assert time.monotonic() < deadline, turn_events
        time.sleep(0.2)
    assert {"mode": "half_duplex"}.items() <= next(e for e in events if e["k"] == "mode").items()

    page.click("#stop")
    wait_for_state(page, "closed")
    # The recording names the mode (the catalogue row; the review page shows it).
    recording = Recording.objects.get(session_id=session_id)
    assert recording.mode == "half_duplex"
    page.goto(f"{unit_live_server.url}/recordings/{recording.pk}/")
    expect(page.locator("dd", has_text="half_duplex")).to_be_visible()
    context.close()
