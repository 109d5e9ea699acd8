"""Acceptance: a browser call on the lockstep engine with a tiny random PersonaPlex checkpoint.

Chromium's fake microphone (espeak-ng speech) feeds a daphne live server whose in-process inference service
runs ``PARLEY_ENGINE=personaplex`` on a ``make-checkpoint --preset tiny-personaplex`` directory (what the first
``make run`` serves). The call goes live after the persona prefill; the random model's audio plays and its
inner monologue fills the transcript; the demo banner says the weights are random.

Browser tests run in their own pytest invocation: ``pytest -m browser tests/browser``.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from inference.models.moshi.make_checkpoint import make_checkpoint
from tests.browser.pages import hooks, login, open_call_page, wait_for, wait_for_state
from tests.live_server import live_server_env, run_live_server

# solo: the tiny model runs on the CPU in real time; beside the other browser lane it fell behind once (three
# `input_backpressure` events, 32 frames dropped), which is the service shedding load as it should, not this call's fault
pytestmark = [pytest.mark.browser, pytest.mark.solo]

START_TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def lockstep_live_server(tmp_path_factory, django_db_setup, django_db_blocker):
    """A daphne live server whose inference service runs the lockstep engine on a tiny checkpoint."""
    checkpoint = make_checkpoint("tiny-personaplex", tmp_path_factory.mktemp("lockstep-browser") / "ckpt", 0)
    with run_live_server(django_db_blocker, live_server_env("personaplex", str(checkpoint))) as server:
        yield server


def test_browser_call_on_the_lockstep_engine(lockstep_live_server, browser, make_user):
    url = lockstep_live_server.url
    make_user("lockstepcaller")
    context = browser.new_context()
    page = context.new_page()
    login(page, url, "lockstepcaller")
    open_call_page(page, url)
    page.click("#start")
    wait_for_state(page, "live", timeout_ms=START_TIMEOUT_MS)
    h = hooks(page)
    caps = h["capabilities"]
    assert (caps["engine"], caps["family"], caps["chunk_period_ms"]) == ("personaplex", "lockstep", 80)
    assert caps["demo_weights"] is True
    expect(page.locator("#banner-demo")).to_be_visible()
    wait_for(page, "p.playedMs > 2000 && p.transcript.length > 0", timeout_ms=START_TIMEOUT_MS)
    h = hooks(page)
    assert h["framesSent"] > 20 and h["receivedRms"] > 0
    assert h["errors"] == []
    page.click("#pause")
    wait_for_state(page, "paused")
    page.click("#resume")
    wait_for_state(page, "live")
    played = hooks(page)["playedMs"]
    wait_for(page, f"p.playedMs > {played + 1000}", timeout_ms=START_TIMEOUT_MS)
    page.click("#stop")
    wait_for_state(page, "closed")
    assert hooks(page)["errors"] == []
    context.close()
