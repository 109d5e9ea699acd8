"""``conversation.item.create`` -> ``ChatMessage``: OpenAI's message shapes taken, everything else a typed error."""

from __future__ import annotations

import base64
import json

import pytest

from inference.contracts import MAX_CHAT_TEXT_CHARS
from webapp.conversations import protocol as p
from webapp.conversations.chat_items import chat_message
from webapp.conversations.server_events import SessionView

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16  # the web tier checks the URI and the base64; the session decodes


def parse(item: dict) -> tuple:
    event = p.parse_client_event(json.dumps({"type": "conversation.item.create", "item": item, "event_id": "e1"}))
    return chat_message(event, SessionView(model=None, input_rates=(24_000,), input_rate=24_000))


def user(*parts: dict) -> dict:
    return {"type": "message", "role": "user", "content": list(parts)}


def test_a_user_message_with_text_image_and_audio():
    image_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    audio = base64.b64encode(b"\x01\x00" * 2400).decode()
    message, item = parse(
        user(
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": image_url},
            {"type": "input_audio", "audio": audio},
            {"type": "input_text", "text": "And this?"},
        )
    )
    assert (message.role, message.text, message.image, message.audio_rate) == (
        "user",
        "What is this?\nAnd this?",
        PNG,
        24_000,
    )
    assert message.audio == b"\x01\x00" * 2400
    assert item["role"] == "user" and [c["type"] for c in item["content"]] == [
        "input_text",
        "input_image",
        "input_audio",
        "input_text",
    ]
    assert item["content"][1]["image_url"] is None  # not echoed back


def test_an_assistant_message_is_history():
    message, _ = parse({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]})
    assert (message.role, message.text) == ("assistant", "Hi.")


@pytest.mark.parametrize(
    ("item", "code", "param"),
    [
        (user({"type": "input_video", "video": "x"}), "invalid_value", "item.content[0].type"),
        (
            user({"type": "input_text", "text": "a"}, {"type": "output_text", "text": "b"}),
            "invalid_value",
            "item.content[1].type",
        ),
        (
            user({"type": "input_image", "image_url": "https://example.com/cat.png"}),
            "invalid_image",
            "item.content[0].image_url",
        ),
        (
            user({"type": "input_image", "image_url": "data:image/png;base64,@@@"}),
            "invalid_image",
            "item.content[0].image_url",
        ),
        (
            user({"type": "input_text", "text": "x" * (MAX_CHAT_TEXT_CHARS + 1)}),
            "message_too_large",
            "item.content[0].text",
        ),
        (user({"type": "input_text", "text": "bad\x00text"}), "invalid_value", "item.content[0].text"),
        (
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "x"}]},
            "invalid_value",
            "item.role",
        ),
        ({"type": "function_call", "name": "f"}, "invalid_value", "item.type"),
        (user(), "invalid_value", "item.content"),
    ],
)
def test_bad_items_are_typed_errors(item, code, param):
    with pytest.raises(p.ProtocolError) as caught:
        parse(item)
    assert (caught.value.code, caught.value.param, caught.value.event_id) == (code, param, "e1")
