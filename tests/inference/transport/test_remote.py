"""Remote mode: the facade against a real ``python -m inference serve`` process on a unix socket."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import tempfile

import pytest

from inference import api
from inference.contracts import (
    AudioOut,
    ChatMessage,
    Closed,
    ErrorEvent,
    ParleyError,
    Prefill,
    Ready,
    Replaced,
    SessionRequest,
    TextOut,
)
from inference.transport import wire
from tests.inference.event_helpers import EventReader, pcm16_frame, send_frames
from tests.inference_service_process import start_inference_service


@pytest.fixture(scope="module")
def service_token():
    """The shared token, in this process's environment (the client's side) for the module's tests."""
    with pytest.MonkeyPatch.context() as patch:
        token = secrets.token_urlsafe(24)
        patch.setenv("PARLEY_INFERENCE_TOKEN", token)
        yield token


@pytest.fixture(scope="module")
def service_socket(service_token):
    """A real service process (echo engine, 1 slot, no queue, 1 s grace) on a short temp socket path."""
    tmp = tempfile.mkdtemp(prefix="parley-", dir="/tmp")  # unix socket paths must stay short; mkdtemp is 0700
    path = os.path.join(tmp, "inference.sock")
    proc, lines = start_inference_service(
        path,
        PARLEY_ENGINE="echo",
        PARLEY_SLOTS="1",
        PARLEY_QUEUE_MAX="0",
        PARLEY_DISCONNECT_GRACE_S="1",
        PARLEY_ECHO_DELAY_FRAMES="2",
    )
    assert any(line.startswith("warming up echo") for line in lines), lines
    yield path
    proc.terminate()
    assert proc.wait(10) == 0
    assert not os.path.exists(path)  # removed on a clean stop
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
async def remote(service_socket):
    await api.start(inference_url=f"unix://{service_socket}")
    yield service_socket
    await api.shutdown()


async def test_remote_session_echoes_audio_and_closes(remote):
    handle = await api.open_session(SessionRequest(user_key="rose", persona="kind"))
    reader = EventReader(handle)
    ready = await reader.next()
    assert isinstance(ready, Ready) and ready.persona == "kind" and ready.capabilities.engine == "echo"
    assert handle.session_id == ready.session_id
    await send_frames(handle, range(200, 210))
    assert await reader.until(Prefill) == Prefill(1.0, True)
    markers = {pcm16_frame(m): m for m in range(200, 210)}
    echoed = []
    while len(echoed) < 5:
        event = await reader.until(AudioOut)
        if event.pcm16 in markers:
            echoed.append(markers[event.pcm16])
    assert echoed == sorted(echoed)
    assert any(isinstance(e, TextOut) and e.text.startswith("[frame ") for e in reader.seen)
    with pytest.raises(ParleyError) as info:
        await handle.append_audio(b"\x00", encoding="pcm16", rate=24000)
    assert info.value.code == "invalid_audio"  # the session goes on
    (snapshot,) = await api.occupancy()
    assert snapshot.slots[0].session_id == ready.session_id
    await handle.close()
    assert await reader.until(Closed) == Closed("client_close")
    assert await reader.ended()


async def test_remote_backpressure_answers_the_append_that_overflowed(remote):
    """As in-process: the append that overflows the inbox raises input_backpressure (the web tier echoes its id)."""
    handle = await api.open_session(SessionRequest(user_key="bea"))
    reader = EventReader(handle)
    await reader.until(Ready)
    await handle.append_audio(pcm16_frame(1), encoding="pcm16", rate=24000)
    await reader.until(Prefill)
    codes = []
    for _ in range(3):  # 3.8 s of audio in three appends, at once: far past the inbox
        try:
            await handle.append_audio(pcm16_frame(2, 16 * 1920), encoding="pcm16", rate=24000)
        except ParleyError as exc:
            codes.append(exc.code)
    assert codes == ["input_backpressure"]
    await handle.close()


async def test_remote_unanswered_append_reports_refusals_as_error_events(remote):
    """A binary frame's append (answered=False) waits for no reply: bad bytes are still refused at once, and
    what the session refuses later (the overflow) comes back as an ErrorEvent; the session goes on."""
    handle = await api.open_session(SessionRequest(user_key="ugo"))
    reader = EventReader(handle)
    await reader.until(Ready)
    await handle.append_audio(pcm16_frame(1), encoding="pcm16", rate=24000, answered=False)
    await reader.until(Prefill)
    with pytest.raises(ParleyError) as info:  # refused from the bytes alone, before sending
        await handle.append_audio(b"\x00", encoding="pcm16", rate=24000, answered=False)
    assert info.value.code == "invalid_audio"
    for _ in range(3):  # 3.8 s of audio at once: far past the inbox; none of these raises
        await handle.append_audio(pcm16_frame(2, 16 * 1920), encoding="pcm16", rate=24000, answered=False)
    error = await reader.until(ErrorEvent)
    assert error.code == "input_backpressure"
    await handle.append_audio(pcm16_frame(3), encoding="pcm16", rate=24000, answered=False)
    await handle.close()
    assert await reader.until(Closed) == Closed("client_close")


async def test_remote_takeover_and_full_service(remote):
    first = await api.open_session(SessionRequest(user_key="sid"))
    first_reader = EventReader(first)
    ready = await first_reader.next()
    second = await api.open_session(SessionRequest(user_key="sid"))
    second_reader = EventReader(second)
    again = await second_reader.next()
    assert isinstance(again, Ready) and again.session_id == ready.session_id and again.resumed
    assert await first_reader.next() == Replaced()
    assert await first_reader.ended()
    await first.close()  # must not end the taken-over session
    with pytest.raises(ParleyError) as info:  # one slot, queueing disabled
        await api.open_session(SessionRequest(user_key="tom"))
    assert info.value.code == "resource_exhausted" and info.value.error_type == "rate_limit_error"
    await send_frames(second, [5] * 5)
    assert isinstance(await second_reader.until(AudioOut), AudioOut)
    assert await api.end_session(ready.session_id) is True
    assert await second_reader.until(Closed) == Closed("admin_ended")


async def test_remote_dropped_socket_resumes_within_grace(remote):
    handle = await api.open_session(SessionRequest(user_key="una"))
    ready = await EventReader(handle).next()
    await handle.append_audio(pcm16_frame(1), encoding="pcm16", rate=24000)
    await handle.detach()  # the web tier's socket dropped
    await asyncio.sleep(0.2)
    (snapshot,) = await api.occupancy()
    assert snapshot.slots[0].state == "detached"
    back = await api.open_session(SessionRequest(user_key="una"))
    again = await EventReader(back).next()
    assert again.session_id == ready.session_id and again.resumed is True
    await back.close()


async def test_garbage_on_the_socket_does_not_hurt_the_service(remote):
    for junk in (b"\xff\xff\xff\xff\x01", wire.frame(wire.JSON, b"not json"), b"\x00\x00"):
        reader, writer = await asyncio.open_unix_connection(remote)
        writer.write(junk)
        await writer.drain()
        writer.close()
    caps = await asyncio.to_thread(api.capabilities_preview)
    assert caps["engine"] == "echo" and caps["extra"]["delay_frames"] == 2
    probe = socket.socket(socket.AF_UNIX)
    probe.connect(remote)  # still listening
    probe.close()


async def test_a_replaced_remote_handle_lets_go_of_its_channel(remote):
    first = await api.open_session(SessionRequest(user_key="val"))
    first_reader = EventReader(first)
    await first_reader.next()
    second = await api.open_session(SessionRequest(user_key="val"))
    await EventReader(second).next()
    assert await first_reader.until(Replaced) == Replaced()
    assert await first_reader.ended()
    await asyncio.sleep(0.05)
    assert first.channel not in first._link.channels  # nothing of it stays on the link
    with pytest.raises(ParleyError) as info:
        await first.pause()
    assert info.value.code == "session_not_ready"
    await second.close()


def test_every_event_type_survives_the_wire():
    from inference.contracts import Decision, ErrorEvent, Metrics, Paused, Queued, Resumed
    from inference.engines.echo import EchoEngine

    caps = EchoEngine(1).capabilities
    events = [
        Queued(2, 3, 45.5),
        Ready("sess_1", True, caps, "calm", "v1"),
        Prefill(0.5, False),
        AudioOut(b"\x01\x00\xff\x7f", 7),
        TextOut("héllo", 1),
        Decision("speak", 4, True),
        Metrics({"tick_ms_p50": 1.5, "frames_in": 3}),
        Paused(),
        Resumed(),
        Replaced(),
        Closed("grace_expired"),
        ErrorEvent("input_backpressure", "slow down"),
    ]
    for event in events:
        data = wire.event_frame(event)
        kind, payload = data[4], data[5:]
        assert int.from_bytes(data[:4], "big") == len(data) - 4
        assert wire.decode_event(kind, payload) == event
    with pytest.raises(wire.WireError):
        wire.event_from_dict({"event": "Hacked"})
    with pytest.raises(wire.WireError):
        wire.event_from_dict({"event": "Queued", "position": 1})


async def test_remote_chat_items_reach_the_session(remote):
    """The op crosses the socket with its bytes; the echo engine serves no chat, so the session refuses it."""
    handle = await api.open_session(SessionRequest(user_key="chatty"))
    reader = EventReader(handle)
    assert isinstance(await reader.next(), Ready)
    with pytest.raises(ParleyError) as info:
        await handle.add_chat_item(ChatMessage("user", "hi", image=b"\x89PNG\r\n\x1a\n\x00"))
    assert info.value.code == "unsupported_mode"
    with pytest.raises(ParleyError) as info:
        await handle.set_mode(mode="chat", turn_detection=None)
    assert info.value.code == "unsupported_mode"
    await handle.close()
    assert await reader.until(Closed) == Closed("client_close")


def test_the_requested_mode_crosses_the_wire():
    request = SessionRequest(user_key="u", mode="chat")
    assert wire.request_from_dict(json.loads(json.dumps(wire.request_to_dict(request)))) == request
    assert wire.request_from_dict({"user_key": "u"}).mode is None
    with pytest.raises(wire.WireError):
        wire.request_from_dict({"user_key": "u", "mode": "telepathy"})


def test_chat_messages_cross_the_wire_intact():
    message = ChatMessage("user", "hé <|im_end|>", image=b"\x89PNG\x00\xff", audio=b"\x01\x02", audio_rate=24_000)
    assert wire.chat_message_from_dict(json.loads(json.dumps(wire.chat_message_to_dict(message)))) == message
    for bad in (None, {"role": "system", "text": "x"}, {"role": "user", "text": "x", "image": "@@"}):
        with pytest.raises(ParleyError) as info:
            wire.chat_message_from_dict(bad)
        assert info.value.code == "invalid_value"
