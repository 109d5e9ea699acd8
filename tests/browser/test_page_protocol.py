"""The call page's side of the protocol, driven event by event through a scripted socket.

The echo engine cannot produce everything the page must handle (unit engines' listen/speak,
video capabilities, malformed events), so here ``window.WebSocket`` is replaced before the
page's scripts run: the test plays the server, and asserts on what the page shows and sends.
The page, its modules, the fake microphone and the fake camera are all real.
"""

from __future__ import annotations

import base64

import pytest
from playwright.sync_api import Page, expect

from tests.browser.pages import hooks, login, open_call_page, wait_for, wait_for_state
from webapp.personas.models import Persona

pytestmark = pytest.mark.browser

SCRIPTED_SOCKET_JS = """
(() => {
  window.__sent = [];
  window.__socketsOpened = 0;
  class ScriptedSocket {
    constructor(url) {
      this.url = url;
      this.readyState = ScriptedSocket.CONNECTING;
      window.__socket = this;
      window.__socketsOpened++;
      setTimeout(() => { this.readyState = ScriptedSocket.OPEN; this.onopen?.({}); }, 10);
    }
    send(data) {  // binary audio frames are recorded as {type: "binary", bytes}
      window.__sent.push(typeof data === "string" ? JSON.parse(data) : {type: "binary", bytes: Array.from(new Uint8Array(data))});
    }
    close(code) { this.readyState = ScriptedSocket.CLOSED; this.onclose?.({code: code ?? 1000}); }
    serverSends(event) { this.onmessage?.({data: typeof event === "string" ? event : JSON.stringify(event)}); }
  }
  Object.assign(ScriptedSocket, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
  window.WebSocket = ScriptedSocket;
})();
"""

UNIT_CAPABILITIES = {
    "engine": "minicpmo",
    "family": "unit",
    "chunk_period_ms": 1000,
    "input_rates": [16000, 24000],
    "output_rate": 24000,
    "video": True,
    "barge_in": True,
    "pause": True,
    "resume": True,
    "demo_weights": True,
}


def server_sends(page: Page, event: dict | str) -> None:
    page.evaluate("(e) => window.__socket.serverSends(e)", event)


def sent(page: Page, event_type: str | None = None) -> list[dict]:
    events = page.evaluate("() => window.__sent")
    return [e for e in events if event_type is None or e["type"] == event_type]


def test_unit_engine_call_with_camera_through_a_scripted_socket(channels_live_server, page, make_user, screenshot_dir):
    url = channels_live_server.url
    make_user("scripted")
    Persona.objects.create(name="Chatty", instructions="You talk a lot.")
    Persona.objects.create(name="Tutor", instructions="You are a patient tutor.")
    page.add_init_script(SCRIPTED_SOCKET_JS)
    login(page, url, "scripted")
    open_call_page(page, url)
    expect(page.locator("#persona")).to_have_value("You talk a lot.")  # the first saved persona
    page.select_option("#persona-preset", label="Tutor")
    expect(page.locator("#persona")).to_have_value("You are a patient tutor.")
    page.click("#start")
    page.wait_for_function("() => window.__socket && window.__socket.readyState === 1")
    assert page.evaluate("() => window.__socket.url").endswith("/v1/realtime")
    assert sent(page) == [], "nothing may be sent before session.created (the server would refuse it)"

    server_sends(page, {"type": "session.queued", "position": 2, "queue_length": 3, "estimated_wait_s": 12.5})
    expect(page.locator("#queue")).to_have_text("Position 2 of 3, about 13 s")
    server_sends(
        page,
        {"type": "session.created", "session": {"id": "sess_scripted", "duplex": {"capabilities": UNIT_CAPABILITIES}}},
    )
    wait_for_state(page, "live")
    expect(page.locator("#queue")).to_be_hidden()
    # Configuration first, then audio: the persona must reach the server before the first frame.
    wait_for(page, "window.__sent.some((e) => e.type === 'binary')")
    first = sent(page)[0]
    assert first["type"] == "session.update"
    assert first["session"]["instructions"] == "You are a patient tutor."
    assert first["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert first["session"]["duplex"]["binary_audio"] is True
    frame = sent(page, "binary")[0]["bytes"]
    # the audio kind, then 20 ms of pcm16 at 24 kHz: the page sends small pieces (less latency)
    assert frame[0] == 0x01 and len(frame) == 1 + 480 * 2

    # Demo weights on a model engine: the banner says so.
    expect(page.locator("#banner-demo")).to_be_visible()
    expect(page.locator("#banner-echo")).to_be_hidden()

    # Unit engines: one decision per unit, drawn and labelled; force listen is offered.
    expect(page.locator("#units")).to_be_visible()
    for unit, kind, end in [(0, "listen", False), (1, "speak", False), (2, "speak", True)]:
        server_sends(page, {"type": f"response.{kind}", "unit": unit, "end_of_turn": end})
    expect(page.locator("#units-last")).to_have_text("unit 2: speak (end of turn)")
    assert [u["kind"] for u in hooks(page)["units"]] == ["listen", "speak", "speak"]
    page.click("#force-listen")
    assert sent(page, "response.force_listen")

    # Video capability: the camera toggle sends one JPEG a second, and stops when turned off.
    page.click("#camera")
    wait_for(page, "p.imagesSent >= 2", timeout_ms=5000)
    image = base64.b64decode(sent(page, "input_image.append")[0]["image"])
    assert image.startswith(b"\xff\xd8\xff"), "camera frames must be JPEG"
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "call-unit-engine.png"), full_page=True)
    page.click("#camera")
    stopped_at = hooks(page)["imagesSent"]
    page.wait_for_timeout(1500)
    assert hooks(page)["imagesSent"] == stopped_at

    # Metrics become figures.
    server_sends(page, {"type": "session.metrics", "metrics": {"tick_ms_p50": 412.3, "tick_ms_p99": 655.0}})
    expect(page.locator("[data-figure=tick_p99]")).to_have_text("655 ms")

    # Non-fatal errors and malformed events are shown or recorded; the call goes on.
    server_sends(
        page,
        {"type": "error", "error": {"type": "invalid_request_error", "code": "input_backpressure", "message": "slow"}},
    )
    expect(page.locator("#notice")).to_contain_text("input_backpressure")
    server_sends(page, {"type": "response.output_audio.delta", "delta": "%%% not base64 %%%"})
    server_sends(page, "{not json")
    codes = [e["code"] for e in hooks(page)["errors"]]
    assert "client_bad_event" in codes and "client_invalid_json" in codes
    assert hooks(page)["state"] == "live"

    server_sends(page, {"type": "session.closed", "reason": "max_duration"})
    wait_for_state(page, "closed")
    expect(page.locator("#call-state-detail")).to_have_text("Reason: max duration")
    frames_at_close = hooks(page)["framesSent"]
    page.wait_for_timeout(300)
    assert hooks(page)["framesSent"] == frames_at_close, "the microphone must stop with the call"


def test_full_queue_fails_the_call_with_a_clear_message(channels_live_server, page, make_user):
    url = channels_live_server.url
    make_user("unlucky")
    page.add_init_script(SCRIPTED_SOCKET_JS)
    login(page, url, "unlucky")
    open_call_page(page, url)
    page.click("#start")
    page.wait_for_function("() => window.__socket && window.__socket.readyState === 1")
    server_sends(
        page,
        {
            "type": "error",
            "error": {"type": "rate_limit_error", "code": "resource_exhausted", "message": "All slots are busy."},
        },
    )
    wait_for_state(page, "failed")
    expect(page.locator("#call-state-detail")).to_contain_text("queue is full")
    expect(page.locator("#start")).to_be_enabled()  # the user can try again


def test_a_dropped_socket_offers_to_resume(channels_live_server, page, make_user):
    url = channels_live_server.url
    make_user("dropped")
    page.add_init_script(SCRIPTED_SOCKET_JS)
    login(page, url, "dropped")
    open_call_page(page, url)
    page.click("#start")
    page.wait_for_function("() => window.__socket && window.__socket.readyState === 1")
    server_sends(page, {"type": "session.created", "session": {"id": "sess_drop", "duplex": {"capabilities": {}}}})
    wait_for_state(page, "live")

    page.evaluate("() => { const s = window.__socket; s.readyState = 3; s.onclose({code: 1006}); }")
    wait_for_state(page, "disconnected")
    expect(page.locator("#call-state-detail")).to_contain_text("Start again within 30 s to resume")
    frames = hooks(page)["framesSent"]
    page.wait_for_timeout(300)
    assert hooks(page)["framesSent"] == frames, "the microphone must stop with the socket"

    page.click("#start")  # a new socket; the server answers with the same session, resumed
    page.wait_for_function("() => window.__socketsOpened === 2 && window.__socket.readyState === 1")
    server_sends(
        page,
        {
            "type": "session.created",
            "resumed": True,
            "session": {"id": "sess_drop", "duplex": {"capabilities": {}, "persona": "The running persona."}},
        },
    )
    wait_for_state(page, "live")
    update = sent(page, "session.update")[-1]
    assert "instructions" not in update["session"], "a resumed session keeps its persona"
    expect(page.locator("#persona")).to_have_value("The running persona.")
    expect(page.locator("#session-id")).to_have_text("sess_drop (resumed)")
