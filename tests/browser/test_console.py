"""The operations console in a real browser: a staff user watches a call live and ends it; others get 403."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.pages import hooks, login, open_call_page, start_call, wait_for, wait_for_state

pytestmark = pytest.mark.browser

CONSOLE_PERMS = ("view_console", "end_session")


def frames_in(row) -> int:
    return int(row.locator("td[data-col=frames_in]").inner_text())


def test_staff_watches_a_call_live_and_ends_it(channels_live_server, browser, make_user, screenshot_dir):
    url = channels_live_server.url
    make_user("console_caller")
    make_user("console_admin", staff=True, perms=CONSOLE_PERMS)
    staff, caller = browser.new_context(), browser.new_context()
    ops, call = staff.new_page(), caller.new_page()
    login(ops, url, "console_admin")
    ops.goto(f"{url}/ops/console/")
    expect(ops.locator("#live-state")).to_have_text("live")
    expect(ops.locator(".service h3")).to_have_text(["in-process"])

    login(call, url, "console_caller")
    open_call_page(call, url)
    session_id = start_call(call)
    wait_for(call, "p.audioChunksReceived > 5")

    row = ops.locator(f'tr[data-session-id="{session_id}"]')
    expect(row).to_be_visible(timeout=5000)  # pushed over /ops/live, no reload
    expect(row.locator("td[data-col=username]")).to_have_text("console_caller")
    expect(row.locator("td[data-col=state]")).to_have_text("active")
    expect(row.locator("td[data-col=engine]")).to_have_text("echo")
    first = frames_in(row)
    # The frame counts move while the caller talks: the console is live, not a snapshot.
    ops.wait_for_function(
        "([id, before]) => Number(document.querySelector(`tr[data-session-id='${id}'] td[data-col=frames_in]`)"
        ".textContent) > before + 5",
        arg=[session_id, first],
        timeout=10_000,
    )
    assert int(row.locator("td[data-col=frames_out]").inner_text()) > 0
    # The search box narrows the table; a search for someone else hides the row.
    ops.fill("#filter-text", "nobody-like-this")
    expect(row).to_be_hidden()
    ops.fill("#filter-text", "console_call")
    expect(row).to_be_visible()
    if screenshot_dir:
        ops.screenshot(path=str(screenshot_dir / "console.png"), full_page=True)

    dialogs: list[str] = []

    def confirm(dialog):
        dialogs.append(dialog.message)
        dialog.accept()

    ops.on("dialog", confirm)
    row.get_by_role("button", name="End").click()
    wait_for_state(call, "closed")
    assert dialogs and session_id in dialogs[0]  # the admin confirmed this very session
    assert hooks(call)["closeReason"] == "admin_ended"
    expect(call.locator("#notice")).to_have_text("An administrator ended this call.")
    expect(row).to_have_count(0, timeout=10_000)
    expect(ops.locator("#action-result")).to_contain_text("ended")
    expect(ops.locator("#audit li").first).to_contain_text("console_admin")
    staff.close()
    caller.close()


def test_non_staff_get_403_for_the_console_and_its_socket(channels_live_server, browser, make_user):
    url = channels_live_server.url
    make_user("console_nosy")
    context = browser.new_context()
    page = context.new_page()
    login(page, url, "console_nosy")
    assert page.goto(f"{url}/ops/console/").status == 403
    # The socket handshake is refused: the browser sees a close without ever opening.
    opened = page.evaluate(
        """() => new Promise((resolve) => {
            const ws = new WebSocket(`ws://${location.host}/ops/live`);
            ws.onopen = () => resolve(true);
            ws.onclose = () => resolve(false);
        })"""
    )
    assert opened is False
    csrf = next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")
    refused = page.request.post(
        f"{url}/ops/console/admission/", form={"confirm": "admission", "open": "0"}, headers={"X-CSRFToken": csrf}
    )
    assert refused.status == 403
    context.close()
