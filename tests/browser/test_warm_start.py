"""Acceptance (issue 32): the first call after the server starts is prepared while it starts (warm start).

A daphne live server with ``PARLEY_WARM_START=auto`` serves the tiny random PersonaPlex checkpoint of the
first ``make run``: as its application loads it begins loading the engine and prefilling the call page's
default persona and voice in the background. The page says "Getting the agent ready…" (Start disabled)
while the server says warming, then is ready to call; the first call's agent audio then plays. The warm-up's
prefill is held until the page has been seen waiting (a ``multiprocessing.Event`` the forked server shares),
so the waiting state is shown whatever the machine's speed. How fast the first audio comes is measured in
``bench/latency_browser.py --engine lockstep --first-call``, not asserted here.
"""

from __future__ import annotations

import multiprocessing
import sys

import pytest
from playwright.sync_api import expect

from inference.engines.lockstep import LockstepEngine
from inference.models.moshi.make_checkpoint import make_checkpoint
from tests.browser.pages import hooks, login, wait_for
from tests.live_server import live_server_env, run_live_server

pytestmark = pytest.mark.browser

READY_TIMEOUT_MS = 120_000
HOLD_LIMIT_S = 120  # the held warm-up goes on by itself after this, so a failed test never hangs the server


@pytest.fixture
def held_warm_start(monkeypatch):
    """The engine's prefill of the warm start waits for ``.set()`` (in the forked server too)."""
    release = multiprocessing.Event()
    prepare = LockstepEngine.prepare_start

    def held(self, config):
        release.wait(HOLD_LIMIT_S)
        return prepare(self, config)

    monkeypatch.setattr(LockstepEngine, "prepare_start", held)
    return release


@pytest.fixture
def warm_live_server(tmp_path_factory, django_db_setup, django_db_blocker, settings, held_warm_start):
    # The forked server reads the settings object as it is here (the test settings say off).
    settings.PARLEY_WARM_START = "auto"
    assert "webapp.asgi" not in sys.modules, "the server must import webapp.asgi itself, after the fork"
    checkpoint = make_checkpoint("tiny-personaplex", tmp_path_factory.mktemp("warm-start") / "ckpt", 0)
    with run_live_server(django_db_blocker, live_server_env("personaplex", str(checkpoint))) as server:
        yield server


def test_the_first_call_waits_for_the_warm_start_then_plays_agent_audio(
    warm_live_server, held_warm_start, browser, make_user
):
    url = warm_live_server.url
    make_user("firstcaller")
    context = browser.new_context()
    page = context.new_page()
    login(page, url, "firstcaller")
    page.goto(f"{url}/?raw=1&transport=websocket")
    # The server is still preparing the default persona and voice: the page says so and Start waits.
    expect(page.locator("#call-state")).to_have_text("Getting the agent ready…", timeout=READY_TIMEOUT_MS)
    expect(page.locator("#start")).to_be_disabled()
    assert hooks(page)["warmStart"] == "warming"
    held_warm_start.set()
    wait_for(page, "p.warmStart === 'ready' && p.state === 'idle'", timeout_ms=READY_TIMEOUT_MS)
    expect(page.locator("#call-state")).to_have_text("Ready to call")
    expect(page.locator("#start")).to_be_enabled()
    page.click("#start")
    wait_for(page, "p.audioChunksReceived > 0 && p.firstAudioMs !== null", timeout_ms=READY_TIMEOUT_MS)
    h = hooks(page)
    assert h["state"] == "live" and h["errors"] == []
    assert "first_sound" in h["startTimeline"]
    assert h["stateHistory"][:2] == ["idle", "warming"]
    page.click("#stop")
    wait_for(page, "p.state === 'closed'")
    context.close()
