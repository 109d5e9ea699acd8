"""Acceptance: audio and omni calls from the browser against the MiniCPM-o unit engine (tiny checkpoint).

Chromium's fake microphone (espeak-ng speech) and fake camera feed a live server whose inference service
runs ``PARLEY_ENGINE=minicpmo`` on the golden pack's tiny random checkpoint, regenerated here by our own
fill. One ``response.listen`` / ``response.speak`` arrives per 1 s unit; the random model speaks after the
three forced listens, so the transcript fills and its Token2Wav audio (tiny random assets) plays; force-listen and pause / resume work.

This module starts its own daphne live server (the shared one runs the echo engine).
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.pages import hooks, login, open_call_page, wait_for, wait_for_state
from tests.live_server import run_unit_live_server

pytestmark = pytest.mark.browser

# Loading and warming the model in the server's worker comes before the first unit.
START_TIMEOUT_MS = 90_000
UNIT_TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def unit_live_server(tmp_path_factory, django_db_setup, django_db_blocker):
    """A daphne live server whose inference service runs the unit engine on a tiny checkpoint."""
    with run_unit_live_server(tmp_path_factory, django_db_blocker) as server:  # the agent speaks noise
        yield server


def _start(page, url: str, username: str, make_user) -> None:
    make_user(username)
    login(page, url, username)
    open_call_page(page, url)
    page.click("#start")
    wait_for_state(page, "live", timeout_ms=START_TIMEOUT_MS)


def _units(page) -> list[dict]:
    return hooks(page)["units"]


def test_audio_call_units_transcript_force_listen_pause_resume(unit_live_server, browser, make_user):
    context = browser.new_context()
    page = context.new_page()
    _start(page, unit_live_server.url, "unitcaller", make_user)
    h = hooks(page)
    assert h["capabilities"]["engine"] == "minicpmo" and h["capabilities"]["family"] == "unit"
    assert h["capabilities"]["vocoder"] == "token2wav" and h["capabilities"]["memory_s"] > 60
    expect(page.locator("#force-listen")).to_be_visible()

    # The first three units are forced listens; the random model speaks from the fourth on.
    wait_for(page, "p.units.length >= 5", timeout_ms=UNIT_TIMEOUT_MS)
    units = _units(page)
    assert [u["kind"] for u in units[:3]] == ["listen"] * 3
    assert any(u["kind"] == "speak" for u in units[3:])
    numbers = [u["unit"] for u in units]
    assert numbers == sorted(set(numbers)), "one decision per unit, in order"
    wait_for(page, "p.transcript.length > 0", timeout_ms=UNIT_TIMEOUT_MS)
    # The speaking units play through the native Token2Wav: audible (noise from random assets), not silence.
    wait_for(page, "p.playedRms > 0.01", timeout_ms=UNIT_TIMEOUT_MS)

    # Force listen: the next unit the server decides is a listen.
    before = len(_units(page))
    page.click("#force-listen")
    wait_for(page, f"p.units.length >= {before + 2}", timeout_ms=UNIT_TIMEOUT_MS)
    assert any(u["kind"] == "listen" for u in _units(page)[before:])

    page.click("#pause")
    wait_for_state(page, "paused")
    paused_units = len(_units(page))
    page.wait_for_timeout(2500)
    assert len(_units(page)) <= paused_units + 1, "units kept coming while paused"  # one may be in flight
    page.click("#resume")
    wait_for_state(page, "live")
    wait_for(page, f"p.units.length >= {len(_units(page)) + 2}", timeout_ms=UNIT_TIMEOUT_MS)
    assert hooks(page)["errors"] == []

    page.click("#stop")
    wait_for_state(page, "closed")
    context.close()


def test_omni_call_sends_camera_frames_and_gets_units(unit_live_server, browser, make_user):
    context = browser.new_context()
    page = context.new_page()
    _start(page, unit_live_server.url, "omnicaller", make_user)
    expect(page.locator("#camera")).to_be_visible()
    page.click("#camera")
    wait_for(page, "p.imagesSent >= 3", timeout_ms=UNIT_TIMEOUT_MS)
    start = len(_units(page))
    wait_for(page, f"p.units.length >= {start + 3}", timeout_ms=UNIT_TIMEOUT_MS)
    assert any(u["kind"] == "speak" for u in _units(page))
    assert hooks(page)["transcript"]
    assert hooks(page)["errors"] == []
    page.click("#stop")
    wait_for_state(page, "closed")
    context.close()
