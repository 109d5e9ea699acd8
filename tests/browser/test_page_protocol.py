"""The call page's side of the protocol, driven event by event through a scripted server.

The echo engine cannot produce everything the page must handle (unit engines' listen/speak,
video capabilities, malformed events), so here Playwright's ``page.route_web_socket`` takes the
page's ``/v1/realtime`` socket: the test plays the server, and asserts on what the page shows and
sends. The page, its socket Worker, its modules, the fake microphone and the fake camera are all real;
the Worker's socket reaches the route through the page's main thread (``worker_socket_relay``).
"""

from __future__ import annotations

import base64
import json
import re
import time

import pytest
from playwright.sync_api import Page, WebSocketRoute, expect

from tests.browser.pages import hooks, login, open_call_page, wait_for, wait_for_state
from tests.browser.worker_socket_relay import relay_worker_sockets
from webapp.personas.models import Persona

pytestmark = pytest.mark.browser


class ScriptedServer:
    """The server end of every socket the page opens to /v1/realtime (mocked: nothing reaches daphne).

    What the page sends is kept in ``received``: JSON events parsed, binary frames as
    ``{"type": "binary", "bytes": b"..."}``. Playwright delivers them while the test is inside a page call,
    so ``wait_until`` waits through the page.
    """

    def __init__(self, page: Page):
        self.page = page
        self.sockets: list[WebSocketRoute] = []
        self.received: list[dict] = []
        relay_worker_sockets(page)
        page.route_web_socket(re.compile(r".*/v1/realtime$"), self._connected)

    def _connected(self, ws: WebSocketRoute) -> None:
        self.sockets.append(ws)
        ws.on_message(self._on_message)

    def _on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            self.received.append({"type": "binary", "bytes": message})
        else:
            self.received.append(json.loads(message))

    @property
    def url(self) -> str:
        return self.sockets[-1].url

    def sends(self, event: dict | str) -> None:
        self.sockets[-1].send(event if isinstance(event, str) else json.dumps(event))

    def sent(self, event_type: str | None = None) -> list[dict]:
        return [e for e in self.received if event_type is None or e["type"] == event_type]

    def wait_until(self, condition, what: str, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.page.wait_for_timeout(20)

    def wait_for_sockets(self, n: int) -> None:
        self.wait_until(lambda: len(self.sockets) >= n, f"socket {n}")


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


def test_unit_engine_call_with_camera_through_a_scripted_socket(channels_live_server, page, make_user, screenshot_dir):
    url = channels_live_server.url
    make_user("scripted")
    Persona.objects.create(name="Chatty", instructions="You talk a lot.")
    Persona.objects.create(name="Tutor", instructions="You are a patient tutor.")
    server = ScriptedServer(page)
    login(page, url, "scripted")
    open_call_page(page, url)
    expect(page.locator("#persona")).to_have_value("You talk a lot.")  # the first saved persona
    page.select_option("#persona-preset", label="Tutor")
    expect(page.locator("#persona")).to_have_value("You are a patient tutor.")
    page.click("#start")
    server.wait_for_sockets(1)
    assert server.url.endswith("/v1/realtime")
    page.wait_for_timeout(100)
    assert server.sent() == [], "nothing may be sent before session.created (the server would refuse it)"

    server.sends({"type": "session.queued", "position": 2, "queue_length": 3, "estimated_wait_s": 12.5})
    expect(page.locator("#queue")).to_have_text("Position 2 of 3, about 13 s")
    server.sends(
        {"type": "session.created", "session": {"id": "sess_scripted", "duplex": {"capabilities": UNIT_CAPABILITIES}}},
    )
    wait_for_state(page, "live")
    expect(page.locator("#queue")).to_be_hidden()
    # Configuration first, then audio: the persona must reach the server before the first frame.
    server.wait_until(lambda: server.sent("binary"), "the first audio frame")
    first = server.sent()[0]
    assert first["type"] == "session.update"
    assert first["session"]["instructions"] == "You are a patient tutor."
    assert first["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert first["session"]["duplex"]["binary_audio"] is True
    frame = server.sent("binary")[0]["bytes"]
    # the audio kind, then 20 ms of pcm16 at 24 kHz: the page sends small pieces (less latency)
    assert frame[0] == 0x01 and len(frame) == 1 + 480 * 2

    # Demo weights on a model engine: the banner says so.
    expect(page.locator("#banner-demo")).to_be_visible()
    expect(page.locator("#banner-echo")).to_be_hidden()

    # Unit engines: one decision per unit, drawn and labelled; force listen is offered.
    expect(page.locator("#units")).to_be_visible()
    for unit, kind, end in [(0, "listen", False), (1, "speak", False), (2, "speak", True)]:
        server.sends({"type": f"response.{kind}", "unit": unit, "end_of_turn": end})
    expect(page.locator("#units-last")).to_have_text("unit 2: speak (end of turn)")
    assert [u["kind"] for u in hooks(page)["units"]] == ["listen", "speak", "speak"]
    page.click("#force-listen")
    server.wait_until(lambda: server.sent("response.force_listen"), "force_listen")

    # Video capability: the camera toggle sends one JPEG a second, and stops when turned off.
    page.click("#camera")
    server.wait_until(lambda: len(server.sent("input_image.append")) >= 2, "two camera frames", timeout_s=5)
    image = base64.b64decode(server.sent("input_image.append")[0]["image"])
    assert image.startswith(b"\xff\xd8\xff"), "camera frames must be JPEG"
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "call-unit-engine.png"), full_page=True)
    page.click("#camera")
    stopped_at = hooks(page)["imagesSent"]
    page.wait_for_timeout(1500)
    assert hooks(page)["imagesSent"] == stopped_at

    # Metrics become figures.
    server.sends({"type": "session.metrics", "metrics": {"tick_ms_p50": 412.3, "tick_ms_p99": 655.0}})
    expect(page.locator("[data-figure=tick_p99]")).to_have_text("655 ms")

    # Non-fatal errors and malformed events are shown or recorded; the call goes on.
    server.sends(
        {"type": "error", "error": {"type": "invalid_request_error", "code": "input_backpressure", "message": "slow"}},
    )
    expect(page.locator("#notice")).to_contain_text("input_backpressure")
    server.sends({"type": "response.output_audio.delta", "delta": "%%% not base64 %%%"})
    server.sends("{not json")
    wait_for(page, "['client_bad_event', 'client_invalid_json'].every((c) => p.errors.some((e) => e.code === c))")
    assert hooks(page)["state"] == "live"

    server.sends({"type": "session.closed", "reason": "max_duration"})
    wait_for_state(page, "closed")
    expect(page.locator("#call-state-detail")).to_have_text("The call reached its maximum length.")
    frames_at_close = hooks(page)["framesSent"]
    page.wait_for_timeout(300)
    assert hooks(page)["framesSent"] == frames_at_close, "the microphone must stop with the call"


def test_full_queue_fails_the_call_with_a_clear_message(channels_live_server, page, make_user):
    url = channels_live_server.url
    make_user("unlucky")
    server = ScriptedServer(page)
    login(page, url, "unlucky")
    open_call_page(page, url)
    page.click("#start")
    server.wait_for_sockets(1)
    server.sends(
        {
            "type": "error",
            "error": {
                "type": "rate_limit_error",
                "code": "resource_exhausted",
                "message": "the engine is at its compute capacity and the queue is full; try again later",
            },
        },
    )
    wait_for_state(page, "failed")
    # the server's reason, not a guess that all slots are busy
    expect(page.locator("#call-state-detail")).to_contain_text("cannot take the call now: the engine is at its compute")
    expect(page.locator("#start")).to_be_enabled()  # the user can try again


def test_a_connect_refusal_whose_close_frame_is_lost_still_says_wait(channels_live_server, page, make_user):
    """The connect limit's refusal is an error event and then close 4429; the close frame can be lost (a
    clean-clone CI run of test_refusals got the error, then 1006): the error event alone decides that the
    caller waits rather than resumes."""
    url = channels_live_server.url
    make_user("eager")
    server = ScriptedServer(page)
    login(page, url, "eager")
    open_call_page(page, url)
    page.click("#start")
    server.wait_for_sockets(1)
    message = "Too many connections with this account; try again in 60 s."
    server.sends(
        {"type": "error", "error": {"type": "rate_limit_error", "code": "rate_limit_exceeded", "message": message}}
    )
    server.sockets[-1].close(code=4000, reason="reset")  # not 4429: the refusal's close code never came
    wait_for_state(page, "failed")
    expect(page.locator("#call-state-detail")).to_have_text("Too many connections: wait a minute, then start again.")
    expect(page.locator("#notice")).to_contain_text("rate_limit_exceeded")
    expect(page.locator("#start")).to_be_enabled()


def live_scripted_call(page: Page, url: str, make_user, username: str, session_id: str) -> ScriptedServer:
    """A signed-in call page whose call is live on a scripted socket (``session.created`` sent)."""
    make_user(username)
    server = ScriptedServer(page)
    login(page, url, username)
    open_call_page(page, url)
    page.click("#start")
    server.wait_for_sockets(1)
    server.sends({"type": "session.created", "session": {"id": session_id, "duplex": {"capabilities": {}}}})
    wait_for_state(page, "live")
    return server


def test_a_dropped_socket_offers_to_resume(channels_live_server, page, make_user):
    url = channels_live_server.url
    server = live_scripted_call(page, url, make_user, "dropped", "sess_drop")

    server.sockets[-1].close(code=4000, reason="dropped")  # any close the page did not ask for
    wait_for_state(page, "disconnected")
    expect(page.locator("#call-state-detail")).to_contain_text("Start again within 30 s to resume")
    frames = hooks(page)["framesSent"]
    page.wait_for_timeout(300)
    assert hooks(page)["framesSent"] == frames, "the microphone must stop with the socket"

    page.click("#start")  # a new socket; the server answers with the same session, resumed
    server.wait_for_sockets(2)
    server.sends(
        {
            "type": "session.created",
            "resumed": True,
            "session": {"id": "sess_drop", "duplex": {"capabilities": {}, "persona": "The running persona."}},
        },
    )
    wait_for_state(page, "live")
    server.wait_until(lambda: len(server.sent("session.update")) >= 2, "the resumed session's update")
    update = server.sent("session.update")[-1]
    assert "instructions" not in update["session"], "a resumed session keeps its persona"
    expect(page.locator("#persona")).to_have_value("The running persona.")
    expect(page.locator("#session-id")).to_have_text("sess_drop (resumed)")


def test_a_socket_that_ends_while_the_call_is_ending_ends_the_call(channels_live_server, page, make_user):
    """Stop, then the socket closes before ``session.closed`` came (a connection dropped on the way out; the
    impairment bench's relay once did it, bench/notes/impairment.md): the call is over, not one to resume."""
    server = live_scripted_call(page, channels_live_server.url, make_user, "stopper", "sess_stop")

    page.click("#stop")
    server.wait_until(lambda: server.sent("session.close"), "the page's session.close")
    server.sockets[-1].close(code=4000, reason="cut")  # no session.closed first
    wait_for_state(page, "closed", timeout_ms=2_000)  # at once, not after the page's 5 s wait for a confirmation
    expect(page.locator("#call-state-detail")).to_contain_text("Call ended")
    expect(page.locator("#call-state-detail")).not_to_contain_text("resume")
