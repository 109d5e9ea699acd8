"""Chat mode through the facade, on a stub engine that answers with the conversation it was given.

The slot is held only while a response runs: a chat session between messages leaves it free for a duplex
caller, and a response asked for while a call holds the only slot waits for it. Bad input is a typed error
and the session goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import time

import numpy as np
import pytest

from inference import api
from inference.contracts import (
    MAX_CHAT_TEXT_CHARS,
    AudioOut,
    ChatMessage,
    ParleyError,
    Queued,
    Ready,
    ResponseEnded,
    ResponseStarted,
    SessionRequest,
    TextOut,
)
from inference.engines.base import ChatRequest, SlotOutput
from inference.engines.echo import EchoEngine
from tests.inference.event_helpers import EventReader


class ChattyEcho(EchoEngine):
    """Echo, plus chat: each reply is two pieces naming the messages it was asked to answer."""

    def __init__(self, num_slots: int = 1):
        super().__init__(num_slots, delay_frames=0)
        self.capabilities = dataclasses.replace(self.capabilities, modes=("duplex", "chat"))
        self.requests: list[tuple[int, ChatRequest]] = []

    def chat(self, slot, request):
        self.requests.append((slot, request))
        said = "|".join(f"{m.role}:{m.text}" for m in request.messages)
        cut_off = request.messages[-1].text == "go on forever"  # as if the reply reached its length cap
        yield SlotOutput(audio=np.full(240, 0.25, np.float32), text=f"[{said}]")
        yield SlotOutput(audio=np.full(240, 0.5, np.float32), text=" done", end_of_turn=True, cut_off=cut_off)


def png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


async def chat_session(user: str):
    handle = await api.open_session(SessionRequest(user_key=user))
    reader = EventReader(handle)
    assert isinstance(await reader.until(Ready, 5), Ready)
    await handle.set_mode(mode="chat", turn_detection=None, max_response_s=2)
    return handle, reader


async def reply(reader: EventReader, started: ResponseStarted | None = None) -> tuple[str, int, str]:
    started = started or await reader.until(ResponseStarted, 10)
    ended = await reader.until(ResponseEnded, 10)
    assert ended.epoch == started.epoch
    text = "".join(e.text for e in reader.seen if isinstance(e, TextOut) and e.epoch == started.epoch)
    audio = [e for e in reader.seen if isinstance(e, AudioOut) and e.epoch == started.epoch]
    assert audio and all(e.pcm16 for e in audio)
    return text, len(audio), ended.status


async def slot_states() -> list[str]:
    """The slots' states once no close is still being confirmed by the worker."""
    for _ in range(200):
        states = [s.state for s in (await api.occupancy())[0].slots]
        if "closing" not in states:
            return states
        await asyncio.sleep(0.02)
    raise AssertionError(f"a slot stays closing: {states}")


async def slot_holders() -> list[str | None]:
    return [s.user_key for s in (await api.occupancy())[0].slots]


async def test_a_conversation_is_answered_and_the_slot_is_free_between_messages(facade):
    engine = ChattyEcho(1)
    await facade(engine_instance=engine, slots=1, queue_max=2)
    handle, reader = await chat_session("chat-user")
    assert await slot_states() == ["free"]  # entering chat mode gave the slot back
    await handle.add_chat_item(ChatMessage("user", "hello", image=png()))
    await handle.create_response()
    text, _, status = await reply(reader)
    assert (text, status) == ("[user:hello] done", "completed")
    assert engine.requests[0][1].max_tokens == 20  # max_response_s 2: about ten ids a second
    # A second message continues the conversation, the reply included.
    await handle.add_chat_item(ChatMessage("user", "again"))
    await handle.create_response()
    text, _, _ = await reply(reader)
    assert text == "[user:hello|assistant:[user:hello] done|user:again] done"

    # Between messages a duplex caller gets the only slot at once ...
    caller = await api.open_session(SessionRequest(user_key="duplex-caller"))
    caller_events = EventReader(caller)
    assert isinstance(await caller_events.until(Ready, 5), Ready)
    # ... and a response asked for meanwhile waits for it, then runs once the call ends.
    await handle.add_chat_item(ChatMessage("user", "third"))
    await handle.create_response()
    started = await reader.until(ResponseStarted, 5)
    assert isinstance(await reader.until(Queued, 5), Queued)
    assert len(engine.requests) == 2
    await caller.close()
    text, _, status = await reply(reader, started)
    assert status == "completed" and text.endswith("|user:third] done")
    assert await slot_states() == ["free"]
    # A reply cut at its length cap ends incomplete (OpenAI's status for max_output_tokens), slot freed.
    await handle.add_chat_item(ChatMessage("user", "go on forever"))
    await handle.create_response()
    _, _, status = await reply(reader)
    assert status == "incomplete"
    assert await slot_states() == ["free"]
    await handle.close()


async def test_a_session_opened_for_chat_takes_no_slot_and_waits_only_for_its_replies(facade):
    """``SessionRequest(mode="chat")``: admitted at once in chat mode while a duplex call holds the only slot."""
    engine = ChattyEcho(1)
    await facade(engine_instance=engine, slots=1, queue_max=1)
    caller = await api.open_session(SessionRequest(user_key="duplex-first"))
    assert isinstance(await EventReader(caller).until(Ready, 5), Ready)
    handle = await api.open_session(SessionRequest(user_key="chat-at-connect", mode="chat"))
    reader = EventReader(handle)
    ready = await reader.next()
    assert isinstance(ready, Ready) and ready.mode == "chat", ready
    assert not any(isinstance(e, Queued) for e in reader.seen)
    assert await slot_holders() == ["duplex-first"]  # still the caller's
    # Its response queues for the slot (the one queue place is free: the chat session did not take it).
    await handle.add_chat_item(ChatMessage("user", "hello"))
    await handle.create_response()
    started = await reader.until(ResponseStarted, 5)
    assert isinstance(await reader.until(Queued, 5), Queued)
    await caller.close()
    text, _, status = await reply(reader, started)
    assert (text, status) == ("[user:hello] done", "completed")
    await handle.close()


async def test_asking_for_chat_at_connect_on_a_duplex_only_engine_opens_as_usual(facade):
    await facade(engine="echo", slots=1)
    handle = await api.open_session(SessionRequest(user_key="chat-hint-echo", mode="chat"))
    ready = await EventReader(handle).until(Ready, 5)
    assert ready.mode == "duplex"
    assert await slot_holders() == ["chat-hint-echo"]
    await handle.close()


async def test_bad_chat_input_is_a_typed_error_and_the_session_goes_on(facade):
    await facade(engine_instance=ChattyEcho(1), slots=1)
    handle = await api.open_session(SessionRequest(user_key="chat-bad"))
    reader = EventReader(handle)
    await reader.until(Ready, 5)

    async def refused(call, code: str) -> None:
        with pytest.raises(ParleyError) as caught:
            await call
        assert caught.value.code == code, caught.value

    await refused(handle.add_chat_item(ChatMessage("user", "not chat yet")), "unsupported_mode")
    await handle.set_mode(mode="chat", turn_detection=None)
    await refused(handle.create_response(), "conversation_empty")
    await refused(handle.add_chat_item(ChatMessage("user", "x", image=b"GIF89a not an image")), "invalid_image")
    broken = png()[:40]  # a PNG header and nothing after it
    await refused(handle.add_chat_item(ChatMessage("user", "x", image=broken)), "invalid_image")
    await refused(handle.add_chat_item(ChatMessage("user", "x" * (MAX_CHAT_TEXT_CHARS + 1))), "message_too_large")
    await refused(handle.add_chat_item(ChatMessage("user", "x", audio=b"\x00" * 3)), "invalid_audio")
    await refused(handle.append_audio(b"\x00\x00" * 480, encoding="pcm16", rate=24_000), "unsupported_mode")
    await refused(handle.set_mode(mode="duplex", turn_detection=None), "mode_update_unsupported")
    # The session goes on: a good message gets its reply; a second response.create while it runs is refused.
    await handle.add_chat_item(ChatMessage("user", "fine"))
    await handle.create_response()
    await refused(handle.create_response(), "conversation_already_has_active_response")
    text, _, _ = await reply(reader)
    assert text == "[user:fine] done"
    await handle.close()


async def test_a_duplex_only_engine_refuses_chat(facade):
    await facade(engine="echo", slots=1)
    handle = await api.open_session(SessionRequest(user_key="chat-echo"))
    await EventReader(handle).until(Ready, 5)
    with pytest.raises(ParleyError) as caught:
        await handle.set_mode(mode="chat", turn_detection=None)
    assert caught.value.code == "unsupported_mode"
    await handle.close()


class LongWinded(ChattyEcho):
    """A reply of many small pieces (each a little work), so that it is still running when it is cancelled."""

    def chat(self, slot, request):
        self.requests.append((slot, request))
        for index in range(2000):
            time.sleep(0.005)
            yield SlotOutput(audio=np.full(240, 0.25, np.float32), text=f"{index} ")
        yield SlotOutput(audio=np.zeros(0, np.float32), end_of_turn=True)


async def test_cancel_ends_the_reply_frees_the_slot_and_keeps_what_was_said(facade):
    engine = LongWinded(1)
    await facade(engine_instance=engine, slots=1)
    handle, reader = await chat_session("chat-cancel")
    await handle.add_chat_item(ChatMessage("user", "talk"))
    await handle.create_response()
    started = await reader.until(ResponseStarted, 5)
    await reader.until(TextOut, 5)
    await handle.cancel()
    ended = await reader.until(ResponseEnded, 5)
    assert (ended.epoch, ended.status) == (started.epoch, "cancelled")
    assert await slot_states() == ["free"]
    # The next response hears what the cancelled one had said.
    await handle.add_chat_item(ChatMessage("user", "go on"))
    await handle.create_response()
    await reader.until(TextOut, 5)
    said = engine.requests[1][1].messages
    assert [m.role for m in said] == ["user", "assistant", "user"] and said[1].text.startswith("0 "), said
    await handle.close()
    assert await slot_states() == ["free"]  # closing mid-reply gives the slot back too
