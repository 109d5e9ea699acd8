"""Chat mode's ``conversation.item.create``: an OpenAI message item -> the facade's ``ChatMessage`` (validation only).

A user message holds ``input_text`` parts, at most one ``input_image`` (GA shape: ``image_url`` a
``data:image/png|jpeg;base64,...`` URI) and at most one ``input_audio`` (base64 pcm16 at the session's input
rate); an assistant message (history the client supplies) holds ``output_text`` / ``text`` parts. Anything
else is ``invalid_value`` naming the part. The size limit (``message_too_large``) and whether an image
decodes (``invalid_image``) are the session's to check, so a socket peer gets the same answers.
"""

from __future__ import annotations

import re
from typing import Any

from inference.contracts import MAX_CHAT_TEXT_CHARS, ChatMessage
from webapp.conversations import protocol as p
from webapp.conversations.server_events import SessionView, new_id

DATA_URL = re.compile(r"data:image/(png|jpeg|jpg);base64,", re.IGNORECASE)
TEXT_PARTS = {"user": ("input_text",), "assistant": ("output_text", "text")}
MAX_PARTS = 16
ITEM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def chat_message(event: p.ConversationItemCreate, view: SessionView) -> tuple[ChatMessage, dict[str, Any]]:
    """The message to hand the session, and the item to echo in ``conversation.item.added`` / ``done``."""
    item, event_id = event.item, event.event_id

    def refuse(param: str, message: str, code: str = "invalid_value") -> p.ProtocolError:
        return p.ProtocolError(code, message, param=param, event_id=event_id)

    if item.get("type", "message") != "message":
        raise refuse("item.type", f"Only message items are taken, not {str(item.get('type'))[:50]!r}.")
    role = item.get("role")
    if role not in TEXT_PARTS:
        raise refuse("item.role", "A chat message's role is user or assistant.")
    content = item.get("content")
    if not isinstance(content, list) or not 0 < len(content) <= MAX_PARTS:
        raise refuse("item.content", f"item.content must be a list of 1 to {MAX_PARTS} parts.")
    texts: list[str] = []
    image = audio = None
    echoed: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        where = f"item.content[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS[role]:
            texts.append(_text(part.get("text"), refuse, f"{where}.text"))
            echoed.append({"type": kind, "text": texts[-1]})
        elif role == "user" and kind == "input_image" and image is None:
            url = part.get("image_url")
            match = DATA_URL.match(url) if isinstance(url, str) else None
            if match is None:
                raise refuse(
                    f"{where}.image_url", "image_url must be a data:image/png or jpeg;base64 URI.", "invalid_image"
                )
            image = p.decode_base64(
                url[match.end() :], code="invalid_image", param=f"{where}.image_url", event_id=event_id
            )
            echoed.append({"type": "input_image", "image_url": None, "detail": part.get("detail")})
        elif role == "user" and kind == "input_audio" and audio is None:
            if view.input_type != "audio/pcm":
                raise refuse(
                    f"{where}.audio",
                    "Audio parts are pcm16 (set the input format to audio/pcm).",
                    "unsupported_audio_format",
                )
            audio = p.decode_base64(
                str(part.get("audio", "")), code="invalid_audio", param=f"{where}.audio", event_id=event_id
            )
            echoed.append({"type": "input_audio", "audio": None, "transcript": part.get("transcript")})
        elif kind in ("input_image", "input_audio") and role == "user":
            raise refuse(f"{where}.type", f"A message holds at most one {kind} part.")
        else:
            raise refuse(f"{where}.type", f"Unknown content part type {str(kind)[:50]!r} for a {role} message.")
    text = "\n".join(texts)
    if len(text) > MAX_CHAT_TEXT_CHARS:
        raise refuse(
            "item.content", f"A chat message holds at most {MAX_CHAT_TEXT_CHARS} characters.", "message_too_large"
        )
    given = item.get("id")
    item_id = given if isinstance(given, str) and ITEM_ID.fullmatch(given) else new_id("item")
    message = ChatMessage(role, text, image, audio, view.input_rate)
    echo = {"id": item_id, "object": "realtime.item", "type": "message", "status": "completed", "role": role}
    return message, {**echo, "content": echoed}


def _text(value: object, refuse, param: str) -> str:
    if not isinstance(value, str):
        raise refuse(param, "A text part needs its text.")
    if len(value) > MAX_CHAT_TEXT_CHARS:
        raise refuse(param, f"A chat message holds at most {MAX_CHAT_TEXT_CHARS} characters.", "message_too_large")
    try:
        return p._clean_text(value)
    except ValueError as exc:
        raise refuse(param, str(exc)) from None
