"""The staff occupancy page against a live call: slot grid, tick chart, and ending a session."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.pages import hooks, login, open_call_page, start_call, wait_for, wait_for_state

pytestmark = pytest.mark.browser


def test_occupancy_page_shows_the_live_session_and_ends_it(channels_live_server, browser, make_user, screenshot_dir):
    url = channels_live_server.url
    make_user("talker")
    make_user("admin1", staff=True, perms=("end_session",))
    caller, staff = browser.new_context(), browser.new_context()
    call = caller.new_page()
    ops = staff.new_page()
    login(call, url, "talker")
    login(ops, url, "admin1")
    open_call_page(call, url)
    session_id = start_call(call)
    wait_for(call, "p.audioChunksReceived > 10")

    ops.goto(f"{url}/ops/")
    slot = ops.locator(f'.slot[data-session-id="{session_id}"]')
    expect(slot).to_have_attribute("data-state", "live")
    expect(slot).to_contain_text("talker")  # the slot names its user, not just an id
    # The tick chart fills as the page polls: a polyline once the worker has ticked.
    expect(ops.locator(".tick-chart polyline").first).to_be_attached(timeout=5000)
    expect(ops.locator("[data-testid=queue-length]")).to_have_text("0")
    if screenshot_dir:
        ops.screenshot(path=str(screenshot_dir / "ops.png"), full_page=True)

    slot.get_by_role("button", name="End session").click()
    wait_for_state(call, "closed")
    assert hooks(call)["closeReason"] == "admin_ended"
    expect(ops.locator(f'.slot[data-session-id="{session_id}"]')).to_have_count(0, timeout=10_000)
    caller.close()
    staff.close()
