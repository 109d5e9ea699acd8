"""Acceptance: a chat conversation from the browser against the unit engine (tiny MiniCPM-o checkpoint).

The page picks chat mode, types a message, attaches a PNG through the file input and sends it; the reply
streams into the chat log (transcript deltas) and its audio plays through the page's player (tiny random
Token2Wav: noise, not silence). A second message continues the conversation; a file that is not an image
gets ``invalid_image`` and the chat goes on. The console lists the session with mode ``chat``. This module
starts its own daphne live server.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import expect

from tests.browser.pages import hooks, login, start_call_in_mode, wait_for, wait_for_state
from tests.live_server import run_unit_live_server
from webapp.recordings.models import Recording

pytestmark = pytest.mark.browser

START_TIMEOUT_MS = 90_000
REPLY_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def chat_live_server(tmp_path_factory, django_db_setup, django_db_blocker):
    with run_unit_live_server(tmp_path_factory, django_db_blocker) as server:
        yield server


@pytest.fixture
def picture(tmp_path: Path) -> Path:
    from PIL import Image

    pixels = (np.indices((48, 64)).sum(axis=0)[..., None] * np.array([3, 5, 7]) % 256).astype(np.uint8)
    path = tmp_path / "picture.png"
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    path.write_bytes(out.getvalue())
    return path


def test_chat_message_with_an_image_gets_a_streamed_spoken_reply(
    chat_live_server, browser, make_user, picture, tmp_path
):
    context = browser.new_context()
    page = context.new_page()
    make_user("chatter", staff=True, perms=("view_console",))
    login(page, chat_live_server.url, "chatter")
    start_call_in_mode(
        page, chat_live_server.url, "chat", "chat", query="max_response_s=2", timeout_ms=START_TIMEOUT_MS
    )
    expect(page.locator("#chat-box")).to_be_visible()

    page.fill("#chat-text", "What is in this picture?")
    page.set_input_files("#chat-image", str(picture))
    page.click("#chat-send")
    wait_for(page, "p.chat.replies.length >= 1", timeout_ms=REPLY_TIMEOUT_MS)
    state = hooks(page)
    reply = state["chat"]["replies"][0]
    # The tiny random model runs to the reply's cap (max_response_s 2: 20 ids): incomplete, as OpenAI says.
    assert reply["status"] == "incomplete" and reply["text"].strip(), state["chat"]
    assert state["eventCounts"].get("response.output_audio_transcript.delta", 0) >= 1
    expect(page.locator(".chat-agent").first).to_contain_text(reply["text"].strip()[:10])
    expect(page.locator(".chat-user").first).to_contain_text("[image: picture.png]")
    wait_for(page, "p.playedRms > 0.01", timeout_ms=REPLY_TIMEOUT_MS)  # the reply's audio played
    assert state["errors"] == [], state["errors"]

    # A file that is not an image: invalid_image, and the chat goes on.
    fake = tmp_path / "fake.png"
    fake.write_bytes(b"this is not a picture at all")
    page.set_input_files("#chat-image", str(fake))
    page.click("#chat-send")
    wait_for(page, "p.errors.some((e) => e.code === 'invalid_image')", timeout_ms=REPLY_TIMEOUT_MS)
    page.fill("#chat-text", "Tell me more.")
    wait_for(page, "!document.getElementById('chat-send').disabled", timeout_ms=REPLY_TIMEOUT_MS)
    page.click("#chat-send")
    wait_for(page, "p.chat.replies.length >= 2", timeout_ms=REPLY_TIMEOUT_MS)
    assert hooks(page)["chat"]["replies"][1]["text"].strip()

    # The console lists the session with its mode.
    console = context.new_page()
    console.goto(f"{chat_live_server.url}/ops/console/")
    row = console.locator(f'tr[data-session-id="{state["sessionId"]}"]')
    expect(row.locator("td[data-col=mode]")).to_have_text("chat", timeout=10_000)
    console.close()

    page.click("#stop")
    wait_for_state(page, "closed")
    # The conversation is recorded: the review page shows mode chat, the messages and the replies.
    recording = Recording.objects.get(session_id=state["sessionId"])
    assert recording.mode == "chat"
    for _ in range(150):  # the server post-processes it (eager Celery) just after the close
        recording.refresh_from_db()
        if recording.status not in (Recording.Status.RECORDING, Recording.Status.PROCESSING):
            break
        time.sleep(0.2)
    assert recording.status == Recording.Status.READY, recording.status_reason
    page.goto(f"{chat_live_server.url}/recordings/{recording.pk}/")
    expect(page.locator("dt:text-is('Mode') + dd")).to_have_text("chat")
    page.wait_for_function("() => window.review && window.review.state === 'ready'", timeout=REPLY_TIMEOUT_MS)
    user_lines = page.locator('#transcript li[data-speaker="user"]')
    expect(user_lines.first).to_contain_text("What is in this picture? [image attached]")
    expect(user_lines.last).to_contain_text("Tell me more.")
    expect(page.locator("#transcript li[data-line]:not([data-speaker])").first).to_be_visible()  # the replies
    context.close()
