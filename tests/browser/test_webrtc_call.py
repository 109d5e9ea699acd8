"""Acceptance: the call page over WebRTC (POST /v1/realtime/calls, Opus both ways, the oai-events data channel).

Chromium's fake microphone plays espeak-ng speech; the echo engine returns it, and the browser's own WebRTC
stack reports what it played (inbound-rtp: samples played, their energy). The session behind it is the
WebSocket's: it shows on the operations console, is recorded, and ends when the caller's account goes.
When WebRTC cannot connect the page says so and calls over the WebSocket instead.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.pages import hooks, login, open_call_page, recording_row, start_call, wait_for, wait_for_state
from tests.live_server import live_server_env, run_live_server
from webapp.recordings.models import Recording

pytestmark = pytest.mark.browser

AUDIBLE_RMS = 0.01  # the fake microphone's speech is about 0.1 with pauses; silence is 0
CONSOLE_PERMS = ("view_console", "end_session")
PROCESSING_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def rtc_server(django_db_setup, django_db_blocker, tmp_path_factory):
    """A live server that records (eager post-processing), echo engine."""
    raw = tmp_path_factory.mktemp("raw-recordings")
    with run_live_server(django_db_blocker, live_server_env("echo", PARLEY_RECORDINGS_DIR=str(raw))) as server:
        yield server


def test_a_call_over_webrtc_is_heard_transcribed_recorded_and_on_the_console(rtc_server, browser, make_user):
    url = rtc_server.url
    user = make_user("rtc_caller")
    make_user("rtc_admin", staff=True, perms=CONSOLE_PERMS)
    caller, staff = browser.new_context(), browser.new_context()
    page, ops = caller.new_page(), staff.new_page()
    login(ops, url, "rtc_admin")
    ops.goto(f"{url}/ops/console/")
    expect(ops.locator("#live-state")).to_have_text("live")
    login(page, url, "rtc_caller")
    open_call_page(page, url, transport="auto")  # the page's default: WebRTC when it can

    session_id = start_call(page)
    expect(page.locator("#transport-shown")).to_have_text("WebRTC")
    assert hooks(page)["transport"] == "webrtc" and hooks(page)["rtcCallId"].startswith("rtc_")
    # The agent is heard: the browser's WebRTC stack played seconds of non-silent audio from the server, in over
    # 100 packets of it (the played time alone counts what the stack concealed while packets were late, as on a
    # loaded machine: 99 packets came with 3 s played in one CI run).
    wait_for(page, f"p.rtc && p.rtc.playedMs > 3000 && p.rtc.packetsReceived > 100 && p.receivedRms > {AUDIBLE_RMS}")
    h = hooks(page)
    assert h["framesSent"] > 20
    assert "[frame" in h["transcript"]  # the echo engine's text, over the data channel
    expect(page.locator("#transcript")).to_contain_text("[frame")
    assert h["capabilities"]["engine"] == "echo" and h["eventCounts"].get("session.updated") == 1
    assert h["errors"] == []
    expect(page.locator("#recording-mark")).to_be_visible()

    row = ops.locator(f'tr[data-session-id="{session_id}"]')  # a live call on the console
    expect(row).to_be_visible(timeout=5000)
    expect(row.locator("td[data-col=username]")).to_have_text("rtc_caller")
    expect(row.locator("td[data-col=state]")).to_have_text("active")

    page.click("#stop")
    wait_for_state(page, "closed")
    assert hooks(page)["closeReason"] == "client_close"
    expect(row).to_have_count(0, timeout=10_000)
    listed = recording_row(page, url, session_id, timeout_ms=PROCESSING_TIMEOUT_MS)
    expect(listed.locator(".status-badge")).to_have_text("ready", timeout=PROCESSING_TIMEOUT_MS)
    recording = Recording.objects.get(session_id=session_id)
    assert recording.user_id == user.pk and recording.duration_s > 2.5
    caller.close()
    staff.close()


def test_deactivating_the_caller_ends_the_webrtc_call(rtc_server, browser, make_user):
    url = rtc_server.url
    user = make_user("rtc_revoked")
    make_user("rtc_user_admin", staff=True, perms=("view_user", "change_user"))
    page, admin = browser.new_context().new_page(), browser.new_context().new_page()
    login(page, url, "rtc_revoked")
    login(admin, url, "rtc_user_admin")
    open_call_page(page, url, transport="webrtc")
    start_call(page)
    wait_for(page, "p.rtc && p.rtc.playedMs > 1000")
    # An administrator deactivates the caller (in the server's process, which announces credentials.revoked
    # to the user's live calls: webapp.accounts.revocation).
    admin.goto(f"{url}/admin/auth/user/{user.pk}/change/")
    admin.uncheck("#id_is_active")
    admin.click("input[name=_save]")
    wait_for_state(page, "closed", timeout_ms=5000)
    assert hooks(page)["closeReason"] == "credentials_revoked"
    expect(page.locator("#call-state-detail")).to_contain_text("access was withdrawn")


def test_the_page_falls_back_to_the_websocket_when_the_offer_is_blocked(rtc_server, browser, make_user):
    url = rtc_server.url
    make_user("rtc_blocked")
    page = browser.new_context().new_page()
    login(page, url, "rtc_blocked")
    page.route("**/v1/realtime/calls*", lambda route: route.abort("blockedbyclient"))  # a proxy refusing it
    open_call_page(page, url, transport="auto")
    start_call(page)
    expect(page.locator("#transport-shown")).to_contain_text("WebSocket (WebRTC failed")
    wait_for(page, f"p.playedMs > 2000 && p.receivedRms > {AUDIBLE_RMS}")  # the page's own jitter player
    assert hooks(page)["transport"] == "websocket"


# A network where no ICE path works (UDP firewalled, no TURN server reachable): the page's peer connection
# may use relay candidates only, and it has no relay, so ICE has nothing to try and fails.
NO_ICE_PATH = """
(() => {
  const Original = window.RTCPeerConnection;
  window.RTCPeerConnection = function (config) {
    return new Original({ ...(config || {}), iceServers: [], iceTransportPolicy: "relay" });
  };
  window.RTCPeerConnection.prototype = Original.prototype;
})();
"""


def test_the_page_falls_back_to_the_websocket_when_ice_cannot_connect(rtc_server, browser, make_user):
    url = rtc_server.url
    make_user("rtc_no_path")
    page = browser.new_context().new_page()
    page.add_init_script(NO_ICE_PATH)
    login(page, url, "rtc_no_path")
    open_call_page(page, url, transport="auto")
    page.click("#start")
    wait_for_state(page, "live", timeout_ms=20_000)  # after the WebRTC connect timeout (8 s) at most
    expect(page.locator("#transport-shown")).to_contain_text("WebSocket (WebRTC failed")
    wait_for(page, f"p.playedMs > 2000 && p.receivedRms > {AUDIBLE_RMS}")
    assert hooks(page)["transportNote"].startswith("WebRTC failed")


def test_webrtc_only_does_not_fall_back(rtc_server, browser, make_user):
    url = rtc_server.url
    make_user("rtc_only")
    page = browser.new_context().new_page()
    page.route("**/v1/realtime/calls*", lambda route: route.abort("blockedbyclient"))
    login(page, url, "rtc_only")
    open_call_page(page, url, transport="webrtc")
    page.click("#start")
    wait_for_state(page, "failed")
    expect(page.locator("#notice")).to_contain_text("WebRTC could not connect")
