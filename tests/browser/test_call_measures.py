"""Acceptance: a recorded call's review shows both speakers' transcripts and its measures, and search finds it
by what the caller said. The fake microphone's espeak-ng speech is the caller (PocketSphinx transcribes it
badly, but whatever words it heard are what the page must show and search must find)."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.browser.pages import login, open_call_page, recording_row, start_call, wait_for, wait_for_state
from tests.live_server import live_server_env, run_live_server
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

pytestmark = pytest.mark.browser

PROCESSING_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def transcribing_server(django_db_setup, django_db_blocker, tmp_path_factory):
    """A live server that records and transcribes the caller (the test settings turn transcription off; the
    server is a fork of this process, so it inherits the setting made here)."""
    from django.conf import settings

    raw = tmp_path_factory.mktemp("raw-recordings")
    before = settings.PARLEY_TRANSCRIBER
    settings.PARLEY_TRANSCRIBER = "pocketsphinx"
    try:
        with run_live_server(django_db_blocker, live_server_env("echo", PARLEY_RECORDINGS_DIR=str(raw))) as server:
            yield server
    finally:
        settings.PARLEY_TRANSCRIBER = before


def test_the_review_shows_both_speakers_and_the_measures_and_search_finds_a_caller_word(
    transcribing_server, browser, make_user
):
    url = transcribing_server.url
    make_user("measured")
    page = browser.new_context().new_page()
    login(page, url, "measured")
    open_call_page(page, url)
    session_id = start_call(page)
    wait_for(page, "p.playedMs > 5000")
    page.click("#stop")
    wait_for_state(page, "closed")

    row = recording_row(page, url, session_id, timeout_ms=PROCESSING_TIMEOUT_MS)
    expect(row.locator(".status-badge")).to_have_text("ready", timeout=PROCESSING_TIMEOUT_MS)
    recording = Recording.objects.get(session_id=session_id)
    lines = json.loads(recordings_storage().open(recording.files["transcript"]).read())["lines"]
    caller_words = [w[0] for line in lines if line.get("speaker") == "caller" for w in line["words"]]
    assert caller_words, "the caller's track was transcribed"

    row.locator("a.open").click()
    page.wait_for_function("() => window.review && window.review.state === 'ready'", timeout=20_000)
    expect(page.locator('#transcript li[data-speaker="caller"]').first).to_contain_text("Caller:")
    expect(page.locator('#transcript li[data-speaker="agent"]').first).to_contain_text("Agent:")
    expect(page.locator("#turn-taking")).to_be_visible()
    expect(page.locator("#tt-latency")).to_contain_text("Response latency")
    expect(page.locator("#tt-echo")).to_be_visible()
    # The strip on the timeline: who spoke when, overlaps, interruptions and response latencies marked. The
    # echo engine answers every sound 240 ms later, so both lanes hold speech and they overlap.
    expect(page.locator("#turn-strip")).to_be_visible()
    strip = page.evaluate("() => window.review.strip")
    measures = Recording.objects.get(session_id=session_id).turn_taking
    assert strip == {
        "segments": len(measures["segments"]),
        "overlaps": len(measures["overlaps"]),
        "interruptions": len(measures["interruptions"]),
        "responses": len(measures["responses"]),
    }
    assert {s[0] for s in measures["segments"]} == {"caller", "agent"} and strip["overlaps"] > 0
    label = page.locator("#turn-strip").get_attribute("aria-label")
    assert f"{strip['overlaps']} overlaps" in label and f"{strip['responses']} response latencies" in label

    word = max(caller_words, key=len)
    page.goto(f"{url}/recordings/?q={word}")
    expect(page.locator("tr[data-recording]")).to_have_count(1)
    page.goto(f"{url}/recordings/?q=zeppelinquux")
    expect(page.locator("tr[data-recording]")).to_have_count(0)
