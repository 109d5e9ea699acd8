"""Acceptance: a caller whose speakers feed the agent back into their microphone is warned live and flagged.

The page's test-only echo loop (``?test_echo_loop=-20,60``, static/call/hooks.js installEchoLoop) feeds the
agent's audio as played back into the microphone's path 20 dB down after 60 ms, as a speaker heard by the
microphone would. The server lines up what the caller heard with their microphone from the playback acks
(inference/session/echo_watch.py), so the delay it finds is the loop's, not the network's. The same call
without the loop must raise no warning and leave the recording unflagged, with its windows measured.

The agent is the lockstep engine on a tiny random checkpoint, whose audio is its own. The echo engine will not
do: its audio is the caller's microphone 240 ms late, so the microphone and the agent's audio are one signal
and the whitened correlation sees that lag, not the loop's (its windows measured 5-13 robust deviations, around
the threshold of 11, and the test passed or failed with the host's load).
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from inference.models.moshi.make_checkpoint import make_checkpoint
from tests.browser.pages import hooks, login, recording_row, start_call, wait_for, wait_for_state
from tests.live_server import live_server_env, run_live_server
from webapp.recordings.models import Recording

# solo: the leak level it finds (-20 +- 3 dB) came out -23.2 dB once beside the other browser lane
pytestmark = [pytest.mark.browser, pytest.mark.solo]

PROCESSING_TIMEOUT_MS = 60_000
WARNING_TIMEOUT_MS = 30_000  # a window every 5 s once the acks cover 4 s


@pytest.fixture(scope="module")
def recording_server(django_db_setup, django_db_blocker, tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw-recordings")
    checkpoint = make_checkpoint("tiny-personaplex", tmp_path_factory.mktemp("echo-loop") / "ckpt", 0)
    env = live_server_env("personaplex", str(checkpoint), PARLEY_RECORDINGS_DIR=str(raw))
    with run_live_server(django_db_blocker, env) as server:
        yield server


def call(page, url: str, query: str) -> str:
    page.goto(f"{url}/?raw=1&transport=websocket{query}")  # the loop and its acks are the jitter player's
    page.wait_for_function("() => window.parley && window.parley.state === 'idle'")
    return start_call(page)


def finish(page, url: str, session_id: str) -> Recording:
    page.click("#stop")
    wait_for_state(page, "closed")
    row = recording_row(page, url, session_id, timeout_ms=PROCESSING_TIMEOUT_MS)
    expect(row.locator(".status-badge")).to_have_text("ready", timeout=PROCESSING_TIMEOUT_MS)
    return Recording.objects.get(session_id=session_id)


def test_a_call_with_the_echo_loop_is_warned_live_and_flagged_with_its_level_and_delay(
    recording_server, browser, make_user
):
    url = recording_server.url
    make_user("speakerphone")
    page = browser.new_context().new_page()
    login(page, url, "speakerphone")
    session_id = call(page, url, "&test_echo_loop=-20,60")
    assert hooks(page)["echoLoop"] == {"db": -20, "ms": 60}
    wait_for(page, "Boolean(p.statusLines.echo)", timeout_ms=WARNING_TIMEOUT_MS)
    expect(page.locator("#server-status")).to_contain_text("use headphones")
    assert hooks(page)["serverStatus"]["code"] == "echo_leak"
    wait_for(page, "p.playedMs > 14000", timeout_ms=45_000)  # a few more windows for the recording's consensus

    recording = finish(page, url, session_id)
    echo = recording.echo_leak
    assert echo["source"] == "live" and echo["flagged"], echo
    # The level's spread, measured: -19..-21 dB on a quiet machine; -23.2 and -23.6 in clean-clone CI runs, where
    # the page's playback under load loops back audio with gaps the acks' instants do not describe to the sample.
    assert echo["leak_db"] == pytest.approx(-20.0, abs=4.0), echo
    assert echo["delay_ms"] == pytest.approx(60.0, abs=10.0), echo
    row = page.locator(f'tr[data-recording][data-session="{session_id}"]')
    expect(row.locator(".echo-flag")).to_be_visible()


def test_the_same_call_without_the_loop_raises_no_warning_and_is_not_flagged(recording_server, browser, make_user):
    url = recording_server.url
    make_user("headphones")
    page = browser.new_context().new_page()
    login(page, url, "headphones")
    session_id = call(page, url, "")
    assert hooks(page)["echoLoop"] is None
    wait_for(page, "p.playedMs > 16000", timeout_ms=45_000)
    assert not hooks(page)["statusLines"].get("echo")
    expect(page.locator("#server-status")).not_to_contain_text("headphones")

    recording = finish(page, url, session_id)
    echo = recording.echo_leak
    assert echo["source"] == "live" and len(echo["windows"]) >= 2, echo  # measured, and found nothing
    assert not echo["flagged"] and echo["flagged_windows"] == 0, echo
    row = page.locator(f'tr[data-recording][data-session="{session_id}"]')
    expect(row.locator(".echo-flag")).to_have_count(0)
