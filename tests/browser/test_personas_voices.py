"""Acceptance: clone a voice in the browser (fake microphone, consent step), make a persona with it, call with both
and see them in the session's capabilities; then edit the persona and see a new version.

The live server runs the lockstep engine on a tiny random PersonaPlex checkpoint, so the voice task computes a
real Mimi-codes prompt and the call prefills it. Chromium's fake microphone (espeak-ng speech, looping) is what
MediaRecorder records. The session's events are read off the real WebSocket (Playwright's frame events).

Browser tests run in their own pytest invocation: ``pytest -m browser tests/browser``.
"""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from inference.models.moshi.make_checkpoint import make_checkpoint
from tests.browser.pages import login, wait_for_state
from tests.live_server import live_server_env, run_live_server
from webapp.personas.models import Persona, Voice

pytestmark = pytest.mark.browser

TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def personaplex_live_server(tmp_path_factory, django_db_setup, django_db_blocker):
    checkpoint = make_checkpoint("tiny-personaplex", tmp_path_factory.mktemp("voices-browser") / "ckpt", 0)
    with run_live_server(django_db_blocker, live_server_env("personaplex", str(checkpoint))) as server:
        yield server


def record(page, kind: str, seconds: float) -> None:
    page.click(f"#record-{kind}")
    expect(page.locator(f"#{kind}-state")).to_contain_text("Recording")
    page.wait_for_timeout(int(seconds * 1000))
    page.click(f"#stop-{kind}")
    expect(page.locator(f"#{kind}-state")).to_contain_text("Recorded", timeout=10_000)


def test_clone_a_voice_with_consent_then_call_with_it_and_version_the_persona(
    personaplex_live_server, page, make_user, screenshot_dir
):
    url = personaplex_live_server.url
    user = make_user("cloner")
    login(page, url, "cloner")

    # 1. clone a voice: the clip and the consent sentence, both recorded from the (fake) microphone
    page.goto(f"{url}/voices/new/")
    sentence = page.locator("#consent-sentence").inner_text()
    assert "My phrase is:" in sentence and "cloner" in sentence
    page.fill("#id_name", "My voice")
    record(page, "clip", 7.0)
    record(page, "consent", 3.0)
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "voice-new.png"), full_page=True)
    page.click("#create-voice")
    page.wait_for_function(
        "() => !location.pathname.endsWith('/new/') || !document.getElementById('upload-errors').hidden",
        timeout=TIMEOUT_MS,
    )
    assert "/new/" not in page.url, page.locator("#upload-errors").inner_text()
    expect(page.locator("#voice-status")).to_have_text("ready", timeout=TIMEOUT_MS)
    expect(page.locator("#voice-percent-label")).to_have_text("100 %")
    expect(page.locator("#voice-preview")).to_have_attribute("src", f"/voices/{Voice.objects.get().pk}/preview/")
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "voice-ready.png"), full_page=True)
    voice = Voice.objects.get(name="My voice")
    assert voice.owner == user and voice.consented_by == user and voice.consent_text == sentence
    assert voice.consent_phrase in sentence and voice.consent_audio.name.endswith(".webm")
    assert voice.reference_audio.name.endswith(".webm") and 3.0 <= voice.duration_s <= 30.0
    assert [p.family for p in voice.prompts.all()] == ["lockstep"]

    # 2. a persona whose default voice is the new one
    page.goto(f"{url}/personas/new/")
    page.fill("#id_name", "Museum guide")
    page.fill("#id_instructions", "You are a calm museum guide.")
    page.select_option("#id_default_voice", label="My voice")
    page.click("#persona-form [type=submit]")
    expect(page.locator("#current-version")).to_have_text("version 1")
    persona = Persona.objects.get(name="Museum guide")

    # 3. a call with that persona and voice; the session's capabilities say so
    received: list[dict] = []

    def on_socket(ws):
        ws.on("framereceived", lambda frame: received.append(json.loads(frame)) if isinstance(frame, str) else None)

    page.on("websocket", on_socket)
    page.goto(f"{url}/?raw=1&transport=websocket")  # the test reads the socket's frames
    page.wait_for_function("() => window.parley && window.parley.state === 'idle'")
    page.select_option("#persona-preset", label="Museum guide")
    expect(page.locator("#voice")).to_have_value(str(voice.pk))  # the persona's default voice
    expect(page.locator("#voice-preview")).to_be_visible()
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "call-persona-voice.png"), full_page=True)
    page.click("#start")
    wait_for_state(page, "live", timeout_ms=TIMEOUT_MS)
    page.wait_for_function(
        "() => window.parley.playedMs > 500", timeout=TIMEOUT_MS
    )  # the agent speaks after the voice + persona prefill
    updated = [e for e in received if e.get("type") == "session.updated"]
    assert updated, [e.get("type") for e in received]
    caps = updated[-1]["session"]["duplex"]["capabilities"]
    assert caps["persona"] == {"id": persona.pk, "version": 1}
    assert caps["voice"] == {"id": voice.pk, "name": "My voice"}
    # a loaded CPU may drop input (input_backpressure); anything else would be this flow's fault
    errors = [e["error"] for e in received if e.get("type") == "error"]
    assert not [e for e in errors if e["code"] != "input_backpressure"], errors
    page.click("#stop")
    wait_for_state(page, "closed")

    # 4. editing the persona makes version 2; both versions are listed
    page.goto(f"{url}/personas/{persona.pk}/edit/")
    page.fill("#id_instructions", "You are a calm and funny museum guide.")
    page.click("#persona-form [type=submit]")
    expect(page.locator("#current-version")).to_have_text("version 2")
    expect(page.locator("#versions li")).to_have_count(2)
    expect(page.locator("#versions li").first).to_contain_text("funny")
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "persona-versions.png"), full_page=True)
