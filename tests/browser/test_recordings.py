"""Acceptance: a recorded call, reviewed in the browser.

A call from the call page (fake microphone, echo engine) shows the "recording" mark; after Stop the
recordings list shows its post-processing reach ``ready``; the review page plays both tracks (the
page's own analysers hear non-silent audio on each), mutes either, shows the transcript and seeks
where a line is clicked; Delete removes it and its files.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.pages import hooks, login, open_call_page, recording_row, start_call, wait_for, wait_for_state
from tests.live_server import live_server_env, run_live_server
from tests.webapp.recordings.test_wall_clock_live import call, processed, speak_pause_speak
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

pytestmark = pytest.mark.browser

AUDIBLE_RMS = 0.01
PROCESSING_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def recording_server(django_db_setup, django_db_blocker, tmp_path_factory):
    """A live server whose inference service records into a temp folder (eager post-processing)."""
    raw = tmp_path_factory.mktemp("raw-recordings")
    with run_live_server(django_db_blocker, live_server_env("echo", PARLEY_RECORDINGS_DIR=str(raw))) as server:
        yield server


def review(page, condition: str, timeout_ms: int = 20_000) -> None:
    page.wait_for_function(f"() => {{ const r = window.review; return r && ({condition}); }}", timeout=timeout_ms)


def test_a_recorded_call_is_processed_reviewed_and_deleted(recording_server, browser, make_user, screenshot_dir):
    url = recording_server.url
    user = make_user("reviewer")
    page = browser.new_context().new_page()
    login(page, url, "reviewer")
    open_call_page(page, url)

    session_id = start_call(page)
    expect(page.locator("#recording-mark")).to_be_visible()
    assert hooks(page)["recorded"] is True
    wait_for(page, "p.playedMs > 4000")
    page.click("#stop")
    wait_for_state(page, "closed")
    expect(page.locator("#recording-mark")).to_be_hidden()

    row = recording_row(page, url, session_id, timeout_ms=PROCESSING_TIMEOUT_MS)
    expect(row.locator(".status-badge")).to_have_text("ready", timeout=PROCESSING_TIMEOUT_MS)
    recording = Recording.objects.get(session_id=session_id)
    assert recording.user_id == user.pk and recording.duration_s > 3.5
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "recordings-list.png"), full_page=True)

    row.locator("a.open").click()
    review(page, "r.state === 'ready'")
    assert page.evaluate("window.review.transcriptLines") > 3
    expect(page.locator("#transcript li").first).to_contain_text("[frame")

    page.click("#play")
    review(page, f"r.callerRms > {AUDIBLE_RMS} && r.agentRms > {AUDIBLE_RMS} && r.position > 1.0")
    # Muting one track silences that path only.
    page.check("#mute-agent")
    review(page, f"r.agentLevel < 0.0005 && r.callerLevel > {AUDIBLE_RMS / 4}")
    page.uncheck("#mute-agent")
    page.check("#mute-caller")
    review(page, f"r.callerLevel < 0.0005 && r.agentLevel > {AUDIBLE_RMS / 4}")
    page.uncheck("#mute-caller")

    # A click on a transcript line seeks there, and that line becomes the current one.
    line = page.locator("#transcript li[data-line]").nth(2)
    start = float(line.get_attribute("data-start"))
    seeks = page.evaluate("window.review.seeks")
    line.click()
    review(page, f"r.seeks === {seeks + 1}")
    review(page, f"Math.abs(r.position - {start}) < 0.6")
    expect(line).to_have_class("current")
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "recording-review.png"), full_page=True)

    names = list(recording.files.values())
    assert names and all(recordings_storage().exists(name) for name in names)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#delete")
    page.wait_for_url(f"{url}/recordings/")
    assert not Recording.objects.filter(session_id=session_id).exists()
    assert not any(recordings_storage().exists(name) for name in names)


def test_the_review_page_shows_a_calls_gap_as_marked_silence(recording_server, browser, make_user):
    """A call whose caller's frames stopped for 3 s: the review page says so in words, and its length is the call's."""
    user = make_user("gap-reviewer")
    session_id, wall_s = call(recording_server, user, speak_pause_speak)
    recording, _ = processed(session_id)
    page = browser.new_context().new_page()
    login(page, recording_server.url, "gap-reviewer")
    page.goto(f"{recording_server.url}/recordings/{recording.pk}/")
    review(page, "r.state === 'ready'")
    assert abs(page.evaluate("window.review.duration") - wall_s) < 0.2
    expect(page.locator("#gaps-summary")).to_contain_text("marked silence")
    expect(page.locator("#gaps li").first).to_contain_text("of silence, no audio arrived from the caller")
