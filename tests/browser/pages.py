"""Small page helpers shared by the browser tests: log in, run a call, read the page's hooks."""

from __future__ import annotations

import re
import time
from typing import Any

from playwright.sync_api import APIRequestContext, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.browser.conftest import PASSWORD

# A call's first audio needs the service to start its worker and the echo delay to pass.
CALL_TIMEOUT_MS = 20_000


def login(page: Page, base_url: str, username: str) -> None:
    page.goto(f"{base_url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("form [type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)


def open_call_page(page: Page, base_url: str, *, transport: str = "websocket") -> None:
    # raw=1: no echo cancellation / noise suppression, so the fake microphone's level is kept.
    # transport: the page's default is WebRTC when it can; the tests of the page's own jitter player and
    # socket Worker ask for the WebSocket (tests/browser/test_webrtc_call.py covers WebRTC).
    page.goto(f"{base_url}/?raw=1&transport={transport}")
    page.wait_for_function("() => window.parley && window.parley.state === 'idle'")


def start_call(page: Page) -> str:
    """Click Start and wait until the session is live; returns its id."""
    page.click("#start")
    wait_for_state(page, "live")
    return hooks(page)["sessionId"]


def start_call_in_mode(page: Page, base_url: str, mode: str, shown: str, *, query: str, timeout_ms: int) -> None:
    """Open the call page (``?query``), pick ``mode`` in the picker, Start, and wait until live in that mode."""
    page.goto(f"{base_url}/?{query}&transport=websocket")
    expect(page.locator("#mode-row")).to_be_visible()
    page.select_option("#mode", mode)
    page.click("#start")
    wait_for_state(page, "live", timeout_ms=timeout_ms)
    expect(page.locator("#mode-shown")).to_have_text(shown)


def wait_for_state(page: Page, state: str, timeout_ms: int = CALL_TIMEOUT_MS) -> None:
    try:
        page.wait_for_function("(s) => window.parley.state === s", arg=state, timeout=timeout_ms)
    except PlaywrightTimeoutError:
        # Where the page stood instead: a wait that times out says no more than that on its own.
        seen = page.evaluate(
            """() => ({state: window.parley.state, notice: document.getElementById("notice")?.textContent,
                      detail: document.getElementById("call-state-detail")?.textContent})"""
        )
        raise AssertionError(f"the page never reached {state!r} within {timeout_ms} ms: {seen}") from None


def wait_for(page: Page, condition: str, timeout_ms: int = CALL_TIMEOUT_MS) -> None:
    """Wait until ``condition`` (a JS expression over ``p = window.parley``) is true."""
    page.wait_for_function(f"() => {{ const p = window.parley; return {condition}; }}", timeout=timeout_ms)


def hooks(page: Page) -> dict[str, Any]:
    """A copy of the page's test hooks (window.parley)."""
    return page.evaluate("() => JSON.parse(JSON.stringify(window.parley))")


def occupancy(request: APIRequestContext, base_url: str) -> dict[str, Any]:
    response = request.get(f"{base_url}/ops/occupancy.json")
    assert response.ok, f"occupancy.json answered {response.status}"
    return response.json()


def wait_until_slot_freed(request: APIRequestContext, base_url: str, session_id: str, timeout_s: float = 10) -> None:
    """The slot is free once the engine confirmed cleanup, which may lag the close event a little."""
    deadline = time.monotonic() + timeout_s
    while True:
        ids = occupancy(request, base_url)["session_ids"]
        if session_id not in ids:
            return
        assert time.monotonic() < deadline, f"session {session_id} still holds a slot: {ids}"
        time.sleep(0.2)


def recording_row(page: Page, base_url: str, session_id: str, *, timeout_ms: int, status: str = "ready"):
    """The recordings list's row of a call once it shows ``status``. The list is reloaded only until the row
    exists (a moment after the call page says closed); from then on the list's own live poll must bring the
    row to ``status``, badge, duration and all, without a reload."""
    row = page.locator(f'tr[data-recording][data-session="{session_id}"]')
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        page.goto(f"{base_url}/recordings/")
        if row.count():
            break
        assert time.monotonic() < deadline, f"no recording row of {session_id} in the list"
        page.wait_for_timeout(1000)
    remaining_ms = max(1000, int((deadline - time.monotonic()) * 1000))
    expect(row.locator(".status-badge")).to_have_text(status, timeout=remaining_ms)
    expect(row).to_have_attribute("data-status", status)
    if status == "ready":
        expect(row.locator(".rec-duration")).to_have_text(re.compile(r"^\d+\.\d s$"))
    return row
