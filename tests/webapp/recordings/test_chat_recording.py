"""A chat conversation through the real /v1/realtime consumer and the in-process service (the chat stub
engine of tests/inference/turns/test_chat.py) is recorded: a catalogue row with mode chat that
post-processing (eager Celery) makes ready, with the user's messages and the replies in its transcript,
the reply's audio on the agent channel and the message's audio clip on the caller's."""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
import pytest
import soundfile as sf
from channels.db import database_sync_to_async

from tests.inference.turns.test_chat import ChattyEcho
from tests.webapp.realtime.realtime_helpers import b64, make_account, ready_peer, to_pcm16, tone
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

from .test_consumer import wait_for_status

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def chatter(raw_dir, media_dir, inference_service):
    await inference_service(engine_instance=ChattyEcho(1))
    return await make_account("chatter")


async def say(peer, content: list[dict]) -> list[dict]:
    """One user message and its reply; returns the events up to response.done."""
    await peer.send(
        {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": content}}
    )
    await peer.until("conversation.item.done")
    await peer.send({"type": "response.create"})
    done = await peer.until("response.done", 10)
    assert done["response"]["status"] == "completed"
    return done


def stored(recording: Recording, kind: str) -> bytes:
    with recordings_storage().open(recording.files[kind]) as f:
        return f.read()


async def test_a_chat_conversation_is_recorded_with_its_messages_and_spoken_replies(chatter, raw_dir):
    peer, created = await ready_peer(chatter)
    session_id = created["session"]["id"]
    await peer.send({"type": "session.update", "session": {"duplex": {"mode": "chat", "max_response_s": 2}}})
    updated = (await peer.until("session.updated"))["session"]["duplex"]
    assert updated["mode"] == "chat" and updated["record"] is True
    await wait_for_status(session_id, Recording.Status.RECORDING)
    row = await database_sync_to_async(Recording.objects.get)(session_id=session_id)
    assert row.mode == "chat"

    await say(peer, [{"type": "input_text", "text": "hello there"}])
    clip = tone(12_000, freq=300)  # 0.5 s at the session's 24 kHz
    await say(
        peer, [{"type": "input_text", "text": "and listen"}, {"type": "input_audio", "audio": b64(to_pcm16(clip))}]
    )
    # The first message fixed the recording: turning it off now is refused, as after a call's first audio.
    await peer.send({"type": "session.update", "session": {"duplex": {"record": False}}, "event_id": "r1"})
    assert (await peer.error())["code"] == "record_update_unsupported"
    await peer.send({"type": "session.close"})
    await peer.until("session.closed")

    await wait_for_status(session_id, Recording.Status.READY)
    row = await database_sync_to_async(Recording.objects.get)(session_id=session_id)
    assert (row.mode, row.close_reason) == ("chat", "client_close")
    lines = json.loads(stored(row, "transcript"))["lines"]
    said = [(line.get("speaker"), line["text"]) for line in lines]
    assert said == [
        ("user", "hello there"),
        (None, "[user:hello there] done"),
        ("user", "and listen [audio attached]"),
        (None, "[user:hello there|assistant:[user:hello there] done|user:and listen] done"),
    ]
    assert "hello there" in row.transcript_text and "[user:hello there] done" in row.transcript_text
    stereo, rate = sf.read(io.BytesIO(stored(row, "wav")), dtype="float32")
    assert rate == 24_000 and row.duration_s == pytest.approx(len(stereo) / rate, abs=0.01)
    agent, caller = stereo[:, 1], stereo[:, 0]
    assert np.abs(agent).max() > 0.2  # the replies' audio (0.25 and 0.5 in the stub)
    assert np.abs(caller).max() > 0.2  # the audio clip
    # Concatenated: the clip sits on the caller channel where the agent is silent, and the other way round.
    loud_caller, loud_agent = np.abs(caller) > 0.05, np.abs(agent) > 0.05
    assert loud_caller.sum() >= 10_000 and not (loud_caller & loud_agent).any()
    timeline = json.loads(stored(row, "timeline"))
    kinds = [m["kind"] for m in timeline["markers"]]
    assert kinds.count("message") == 2 and kinds.count("response") == 2 and "barge_in" not in kinds
    assert not (raw_dir / session_id).exists()


async def test_a_chat_closed_without_a_message_leaves_no_recording(chatter, raw_dir):
    peer, created = await ready_peer(chatter)
    session_id = created["session"]["id"]
    await peer.send({"type": "session.update", "session": {"duplex": {"mode": "chat"}}})
    await peer.until("session.updated")
    await wait_for_status(session_id, Recording.Status.RECORDING)
    await peer.send({"type": "session.close"})
    await peer.until("session.closed")
    for _ in range(100):  # the close is handled in a task of its own, after session.closed is sent
        if not await database_sync_to_async(Recording.objects.filter(session_id=session_id).exists)():
            break
        await asyncio.sleep(0.05)
    assert not await database_sync_to_async(Recording.objects.filter(session_id=session_id).exists)()
