"""The stock ``openai`` SDK holds a chat conversation with the unit engine (tiny MiniCPM-o checkpoint).

Messages go in as ``conversation.item.create`` (text, a PNG as an ``input_image`` data URI, an ``input_audio``
clip), each answered after ``response.create`` with streamed transcript and audio deltas and ``response.done``.
The engine slot is held only while a response runs: between messages a duplex caller gets the server's one
slot at once, and a response asked for meanwhile waits until that call ends. Bad items are typed errors and
the session goes on. This module starts its own daphne live server running the unit engine.
"""

from __future__ import annotations

import base64
import io
import time

import numpy as np
import pytest
import soundfile as sf

from inference.contracts import MAX_CHAT_TEXT_CHARS
from tests.live_server import run_unit_live_server
from tests.sdk.test_openai_half_duplex import collect_until, connect, expect_error, sdk_client
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

pytestmark = pytest.mark.django_db(transaction=True)
RATE = 24_000


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory, django_db_setup, django_db_blocker):
    """One slot, so that a chat session holding it between messages would lock the duplex caller out."""
    with run_unit_live_server(tmp_path_factory, django_db_blocker, PARLEY_SLOTS="1", PARLEY_QUEUE_MAX="2") as server:
        yield server


def png_data_url() -> str:
    from PIL import Image

    pixels = (np.arange(32 * 24 * 3).reshape(24, 32, 3) * 7 % 256).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def tone_b64(seconds: float) -> str:
    t = np.arange(int(seconds * RATE)) / RATE
    return base64.b64encode((0.3 * np.sin(2 * np.pi * 330 * t) * 32767).astype("<i2").tobytes()).decode()


def user_item(*parts: dict) -> dict:
    return {"type": "message", "role": "user", "content": list(parts)}


def text(value: str) -> dict:
    return {"type": "input_text", "text": value}


def chat_mode(connection) -> None:
    connection.send({"type": "session.update", "session": {"duplex": {"mode": "chat", "max_response_s": 2}}})
    updated = collect_until(connection, "session.updated")[-1].session.model_dump()
    assert updated["duplex"]["mode"] == "chat" and updated["duplex"]["max_response_s"] == 2
    assert updated["duplex"]["record"] is True  # recorded as a call is (the server's policy is auto)


def ask(connection, item: dict) -> list:
    """Add ``item``, ask for a response; every event through ``response.done``."""
    connection.conversation.item.create(item=item)
    added = collect_until(connection, "conversation.item.done")
    assert [e.type for e in added][-2:] == ["conversation.item.added", "conversation.item.done"]
    connection.response.create()
    return collect_until(connection, "response.done")


def transcript_of(events: list) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")


def audio_of(events: list) -> np.ndarray:
    pieces = [base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"]
    return np.frombuffer(b"".join(pieces), dtype="<i2").astype(np.float32) / 32768.0


def test_sdk_chat_conversation_streams_replies_and_holds_no_slot_between_messages(chat_server):
    client = sdk_client(chat_server, "sdk-chat")
    with connect(chat_server, "", client) as connection:
        created = collect_until(connection, "session.created")[-1]
        assert "chat" in created.session.model_dump()["duplex"]["capabilities"]["modes"]
        expect_error(
            connection, {"type": "conversation.item.create", "item": user_item(text("hi"))}, "unsupported_mode"
        )
        chat_mode(connection)

        # A message with an image: a streamed reply, in OpenAI's order.
        first = ask(
            connection,
            user_item(text("What is in this picture?"), {"type": "input_image", "image_url": png_data_url()}),
        )
        types = [e.type for e in first]
        order = [
            types.index(t)
            for t in (
                "response.created",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_audio_transcript.delta",
                "response.output_audio.done",
                "response.output_item.done",
                "response.done",
            )
        ]
        assert order == sorted(order), types
        assert_ran_to_its_cap(first[-1].response)
        assert transcript_of(first).strip()
        audio = audio_of(first)
        assert audio.size and float(np.sqrt(np.mean(audio**2))) > 1e-3, "the reply is spoken (noise, not silence)"
        done_item = first[-1].response.output[0]
        assert done_item.content[0].transcript == transcript_of(first)

        # Between messages the one slot is free: a duplex caller is admitted at once ...
        with connect(chat_server, "sdk-chat-duplex-caller") as caller:
            assert collect_until(caller, "session.created")[-1].session.model_dump()["duplex"]["mode"] == "duplex"
            # ... and a response asked for meanwhile waits in the queue for it (it continues the conversation,
            # with an audio clip this time), and runs once the call has ended.
            connection.conversation.item.create(
                item=user_item(text("And this sound?"), {"type": "input_audio", "audio": tone_b64(0.6)})
            )
            collect_until(connection, "conversation.item.done")
            connection.response.create()
            events = collect_until(connection, "session.queued")
            assert "response.created" in [e.type for e in events]
            expect_error(connection, {"type": "response.create"}, "conversation_already_has_active_response")
            caller.send({"type": "session.close"})
            collect_until(caller, "session.closed")
        second = collect_until(connection, "response.done")
        assert_ran_to_its_cap(second[-1].response)
        assert transcript_of(second).strip()

        # Bad items: typed errors, and the session goes on.
        not_png = "data:image/png;base64," + base64.b64encode(b"this is not an image").decode()
        bad = [
            (user_item(text("x"), {"type": "input_image", "image_url": not_png}), "invalid_image"),
            (user_item({"type": "input_video", "video": "x"}), "invalid_value"),
            (user_item(text("x" * (MAX_CHAT_TEXT_CHARS + 1))), "message_too_large"),
        ]
        for item, code in bad:
            expect_error(connection, {"type": "conversation.item.create", "item": item}, code)
        third = ask(connection, user_item(text("Still there?")))
        assert_ran_to_its_cap(third[-1].response)
        connection.send({"type": "session.close"})
        collect_until(connection, "session.closed")

    # The conversation is recorded: mode chat, post-processed to ready, the messages and replies in its
    # transcript, the replies' audio on the agent channel.
    row = processed_recording(created.session.id)
    assert (row.mode, row.status) == ("chat", Recording.Status.READY), row.status_reason
    said = "".join(row.transcript_text.split())
    for part in ("What is in this picture? [image attached]", "And this sound? [audio attached]", "Still there?"):
        assert "".join(part.split()) in said, row.transcript_text
    for reply in (first, second, third):
        assert "".join(transcript_of(reply).split()) in said, row.transcript_text
    with recordings_storage().open(row.files["wav"]) as f:
        stereo, _ = sf.read(io.BytesIO(f.read()), dtype="float32")
    assert float(np.sqrt(np.mean(stereo[:, 1] ** 2))) > 1e-3, "the agent channel holds the spoken replies"


def processed_recording(session_id: str) -> Recording:
    """The session's catalogue row once the server's (eager) post-processing has finished with it."""
    deadline = time.monotonic() + 30
    while True:
        row = Recording.objects.filter(session_id=session_id).first()
        if row is not None and row.status not in (Recording.Status.RECORDING, Recording.Status.PROCESSING):
            return row
        assert time.monotonic() < deadline, f"not processed: {row and row.status}"
        time.sleep(0.2)


def assert_ran_to_its_cap(response) -> None:
    """The tiny random model never picks a stop id within the 20 ids of max_response_s 2: each reply stops at
    the cap, which OpenAI's vocabulary calls incomplete for max_output_tokens."""
    assert response.status == "incomplete", response
    assert response.status_details.type == "incomplete" and response.status_details.reason == "max_output_tokens"


def test_the_same_conversation_gets_the_same_reply(chat_server):
    replies = []
    for name in ("sdk-chat-same-1", "sdk-chat-same-2"):
        with connect(chat_server, name) as connection:
            collect_until(connection, "session.created")
            chat_mode(connection)
            replies.append(transcript_of(ask(connection, user_item(text("Tell me a story.")))))
            connection.send({"type": "session.close"})
            collect_until(connection, "session.closed")
    assert replies[0] == replies[1] and replies[0].strip()


def test_a_client_asking_for_chat_at_connect_is_not_queued_behind_a_call(chat_server):
    """``?mode=chat`` (extension, through the SDK's ``extra_query``): with the one slot held by a duplex call,
    the chat client is admitted at once in chat mode; only its response waits for the slot."""
    with connect(chat_server, "sdk-chat-first-caller") as caller:
        assert collect_until(caller, "session.created")[-1].session.model_dump()["duplex"]["mode"] == "duplex"
        client = sdk_client(chat_server, "sdk-chat-at-connect")
        options = {"open_timeout": 180}
        with client.realtime.connect(
            model="minicpmo", extra_query={"mode": "chat"}, websocket_connection_options=options
        ) as connection:
            opened = collect_until(connection, "session.created")
            assert "session.queued" not in [e.type for e in opened]
            assert opened[-1].session.model_dump()["duplex"]["mode"] == "chat"
            connection.send({"type": "session.update", "session": {"duplex": {"max_response_s": 2}}})
            collect_until(connection, "session.updated")
            connection.conversation.item.create(item=user_item(text("Hello?")))
            collect_until(connection, "conversation.item.done")
            connection.response.create()
            assert "response.created" in [e.type for e in collect_until(connection, "session.queued")]
            caller.send({"type": "session.close"})
            collect_until(caller, "session.closed")
            done = collect_until(connection, "response.done")
            assert_ran_to_its_cap(done[-1].response)
            assert transcript_of(done).strip()
            connection.send({"type": "session.close"})
            collect_until(connection, "session.closed")
