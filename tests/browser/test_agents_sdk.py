"""The unmodified ``@openai/agents-realtime`` bundle (npm, pinned in package.json) against Parley.

A third-party app's page, served by the test on its own origin (``localhost``, while daphne is on
``127.0.0.1``), loads the SDK's UMD bundle straight from node_modules. The app's server (the test) mints a
client secret with ``POST /v1/realtime/client_secrets``; the page hands it to the SDK, which connects the way
it connects to OpenAI: over the WebSocket, and over WebRTC (the SDK's default transport, posting its offer to
``/v1/realtime/calls`` across origins: CORS). Chromium's fake microphone speaks; the tiny random PersonaPlex answers with audio
and an inner-monologue transcript, which must reach the SDK as its own events.

Browser tests run in their own pytest invocation: ``pytest -m browser tests/browser``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.request
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from inference.models.moshi.make_checkpoint import make_checkpoint
from tests.live_server import live_server_env, run_live_server
from webapp.accounts.services import apikey_create

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "node_modules" / "@openai" / "agents-realtime" / "dist" / "bundle" / "openai-realtime-agents.umd.js"
PAGE = Path(__file__).resolve().parent / "sdk_page" / "agent.html"
INSTRUCTIONS = "You are a tour guide for the city museum."
TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def sdk_server(tmp_path_factory, django_db_setup, django_db_blocker):
    """daphne with the lockstep engine on a tiny random checkpoint: it speaks and writes text from the start."""
    checkpoint = make_checkpoint("tiny-personaplex", tmp_path_factory.mktemp("agents-sdk") / "ckpt", 0)
    with run_live_server(django_db_blocker, live_server_env("personaplex", str(checkpoint))) as server:
        yield server


class _AppPages(SimpleHTTPRequestHandler):
    """The app's two files: its page and the SDK bundle, byte for byte as npm installed it."""

    FILES = {"/agent.html": (PAGE, "text/html"), "/agents-realtime.umd.js": (BUNDLE, "text/javascript")}

    def do_GET(self) -> None:
        if self.path not in self.FILES:
            self.send_error(404)
            return
        path, content_type = self.FILES[self.path]
        body = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def app_origin() -> Iterator[str]:
    if not BUNDLE.exists():
        pytest.skip(f"{BUNDLE} is missing: npm ci (scripts/install-system.sh test) installs it")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_AppPages, directory=str(PAGE.parent)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        # localhost, not 127.0.0.1: another origin than daphne's, and still a secure context for getUserMedia.
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def mint_secret(server, username: str) -> str:
    """What the app's server does: its API key buys a secret for one session of this configuration."""
    user = get_user_model().objects.create_user(username=username, password="pw-for-tests-only")
    key = apikey_create(user=user, name="app backend")[1]
    body = {"expires_after": {"anchor": "created_at", "seconds": 120}, "session": {"instructions": INSTRUCTIONS}}
    request = urllib.request.Request(
        f"{server.url}/v1/realtime/client_secrets",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["value"]


def protocol_errors(state: dict) -> list[str]:
    """The errors the SDK reported, less the server saying it is behind: the tiny model on this machine's
    shared CPU cores may step slower than real time, and then drops the oldest input (``input_backpressure``)."""
    return [error for error in state["errors"] if '"input_backpressure"' not in error]


def sdk_state(page) -> dict:
    return page.evaluate("() => JSON.parse(JSON.stringify(window.sdk))")


@contextlib.contextmanager
def app_page(browser, app_origin: str):
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{app_origin}/agent.html")
    page.wait_for_function("() => window.OpenAIAgentsRealtime && window.runAgent")
    try:
        yield page
    finally:
        with contextlib.suppress(Exception):
            page.evaluate("() => window.agentSession && window.agentSession.close()")
        context.close()


@pytest.mark.django_db(transaction=True)
def test_stock_agents_sdk_over_the_websocket_with_a_client_secret(sdk_server, app_origin, browser):
    secret = mint_secret(sdk_server, "sdk-websocket")
    with app_page(browser, app_origin) as page:
        args = {"kind": "websocket", "url": f"{sdk_server.ws_url}/v1/realtime", "secret": secret}
        page.evaluate("(a) => window.runAgent(a)", {**args, "instructions": INSTRUCTIONS, "model": "personaplex"})
        page.wait_for_function(
            "() => sdk.audioBytes > 48000 && sdk.transcriptDeltas > 0 && sdk.micFrames > 20", timeout=TIMEOUT_MS
        )
        state = sdk_state(page)
    assert state["connected"]
    assert protocol_errors(state) == []
    events = state["eventTypes"]
    assert events.get("session.created") == 1 and events.get("session.updated", 0) >= 1, events
    assert events["response.output_audio.delta"] >= 10 and state["transcript"].strip(), state


@pytest.mark.django_db(transaction=True)
def test_stock_agents_sdk_over_webrtc_with_a_client_secret(sdk_server, app_origin, browser):
    """The SDK's default transport: SDP offer to /v1/realtime/calls, Opus both ways, events on oai-events."""
    secret = mint_secret(sdk_server, "sdk-webrtc")
    with app_page(browser, app_origin) as page:
        args = {"kind": "webrtc", "url": f"{sdk_server.url}/v1/realtime/calls", "secret": secret}
        page.evaluate("(a) => window.runAgent(a)", {**args, "instructions": INSTRUCTIONS, "model": "personaplex"})
        page.wait_for_function(
            "() => sdk.webrtcPackets > 50 && sdk.webrtcEnergy > 0 && sdk.transcriptDeltas > 0", timeout=TIMEOUT_MS
        )
        state = sdk_state(page)
    assert state["connected"]
    assert protocol_errors(state) == []
    assert state["eventTypes"].get("session.created") == 1 and state["transcript"].strip(), state
