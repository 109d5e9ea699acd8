"""Finding 6 (CSP): the call page and the operations page work under the Content-Security-Policy,
with no violation reported by the browser."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.pages import login, open_call_page, start_call, wait_for

pytestmark = pytest.mark.browser

# Runs before any page script (through the DevTools protocol, which CSP does not govern).
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


def violations(page: Page) -> list[str]:
    return page.evaluate("() => window.__cspViolations")


def test_call_and_operations_pages_run_under_the_csp_without_violations(channels_live_server, browser, make_user):
    url = channels_live_server.url
    talker = make_user("talker")
    make_user("admin1", staff=True, perms=("end_session",))
    caller, staff = browser.new_context(), browser.new_context()
    for context in (caller, staff):
        context.add_init_script(RECORD_VIOLATIONS)
    call, ops = caller.new_page(), staff.new_page()

    response = call.goto(f"{url}/accounts/login/")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
    login(call, url, "talker")
    open_call_page(call, url)
    # The base stylesheet (inline, with the nonce) applied: the navigation bar has its dark background.
    expect(call.locator("nav.site-nav")).to_have_css("background-color", "rgb(29, 43, 58)")
    start_call(call)
    wait_for(call, "p.audioChunksReceived > 5")  # the socket, the worklet and the player all ran

    login(ops, url, "admin1")
    ops.goto(f"{url}/ops/")
    expect(ops.locator(".slot[data-state=live]").first).to_be_attached(timeout=10_000)
    ops.wait_for_timeout(1500)  # at least one poll of the workers fragment (swapped in by ops.js)
    from django.utils import timezone

    from webapp.recordings.models import Recording

    Recording.objects.create(  # one measured call, so that the dashboard draws its charts
        user=talker, session_id="sess_csp_measured", engine="echo", started_at=timezone.now(), duration_s=30.0,
        turn_taking={"response_latency_mean_s": 0.3, "overlaps": []}, echo_leak={"flagged": False},
    )  # fmt: skip
    measures = staff.new_page()  # the call-measures dashboard: inline SVG charts, drawn on the server
    measures.goto(f"{url}/ops/measures/")
    expect(measures.locator("#measures")).to_be_visible()
    expect(measures.locator("svg#chart-latency_s polyline")).to_have_count(1)

    assert violations(call) == [] and violations(ops) == [] and violations(measures) == []
    caller.close()
    staff.close()
