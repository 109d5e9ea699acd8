"""The call page's transcript: one line per turn, labelled with the speaker and the time since Start, the caller's
side (input transcription events) laid out beside the agent's. Driven through a scripted server, since the echo
engine transcribes nobody."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.pages import login, open_call_page, wait_for_state
from tests.browser.test_page_protocol import ScriptedServer

pytestmark = pytest.mark.browser

CAPABILITIES = {"engine": "echo", "family": "echo", "chunk_period_ms": 80, "input_rates": [24000], "output_rate": 24000}


def test_turns_are_labelled_and_timed_for_both_speakers(channels_live_server, page, make_user, screenshot_dir):
    url = channels_live_server.url
    make_user("transcribed")
    server = ScriptedServer(page)
    login(page, url, "transcribed")
    open_call_page(page, url)
    page.click("#start")
    server.wait_for_sockets(1)
    server.sends({"type": "session.created", "session": {"id": "sess_words", "duplex": {"capabilities": CAPABILITIES}}})
    wait_for_state(page, "live")

    for delta in ("Hello, ", "how can I help?"):
        server.sends({"type": "response.output_audio_transcript.delta", "delta": delta})
    server.sends({"type": "response.output_audio_transcript.done", "transcript": "Hello, how can I help?"})
    server.sends({"type": "conversation.item.input_audio_transcription.delta", "delta": "Tell me a"})
    server.sends({"type": "conversation.item.input_audio_transcription.completed", "transcript": "Tell me a story."})
    server.sends({"type": "response.output_audio_transcript.delta", "delta": "Once upon a time"})

    lines = page.locator("#transcript li")
    expect(lines).to_have_count(3)
    expect(lines.locator(".who")).to_have_text(["Agent", "You", "Agent"])
    expect(lines.locator(".said")).to_have_text(["Hello, how can I help?", "Tell me a story.", "Once upon a time"])
    for i in range(3):
        expect(lines.nth(i).locator("time.at")).to_have_text(re.compile(r"^\d+:\d\d$"))
    assert lines.nth(1).get_attribute("data-speaker") == "caller"
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "call-transcript.png"), full_page=True)
