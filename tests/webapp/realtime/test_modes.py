"""Session modes on an engine that serves duplex only (echo, like the lockstep engines)."""

import pytest

from tests.webapp.realtime.realtime_helpers import ready_peer

pytestmark = pytest.mark.django_db(transaction=True)


async def test_duplex_only_engine_lists_its_mode_and_refuses_others(alice):
    peer, created = await ready_peer(alice)
    assert created["session"]["duplex"]["capabilities"]["modes"] == ["duplex"]
    assert created["session"]["duplex"]["mode"] == "duplex"
    for mode in ("half_duplex", "chat"):
        await peer.send({"type": "session.update", "session": {"duplex": {"mode": mode}}, "event_id": f"m-{mode}"})
        error = await peer.error()
        assert error["code"] == "unsupported_mode" and error["event_id"] == f"m-{mode}"
        assert error["param"] == "session.duplex.mode"
    await peer.send({"type": "session.update", "session": {"duplex": {"mode": "duplex"}}})
    assert (await peer.until("session.updated"))["session"]["duplex"]["mode"] == "duplex"
    await peer.proves_alive()
    await peer.close()


@pytest.mark.parametrize(
    ("turn_detection", "code", "param"),
    [
        ({"type": "push_to_talk"}, "invalid_value", "session.audio.input.turn_detection.type"),
        ({"type": "server_vad", "threshold": 1.01}, "invalid_value", "session.audio.input.turn_detection.threshold"),
        (
            {"type": "server_vad", "prefix_padding_ms": -5},
            "invalid_value",
            "session.audio.input.turn_detection.prefix_padding_ms",
        ),
        (
            {"type": "server_vad", "silence_duration_ms": 10**6},
            "invalid_value",
            "session.audio.input.turn_detection.silence_duration_ms",
        ),
    ],
)
async def test_bad_turn_detection_is_a_typed_error_and_the_session_goes_on(alice, turn_detection, code, param):
    peer, _ = await ready_peer(alice)
    await peer.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": turn_detection}}}})
    error = await peer.error()
    assert (error["code"], error["param"]) == (code, param)
    await peer.proves_alive()
    await peer.close()


async def test_semantic_vad_is_ignored_by_a_duplex_only_engine(alice):
    """The agents SDK sends ``semantic_vad`` in every session.update; the echo engine takes no turns, so like any
    turn_detection it is ignored there (an engine that serves half-duplex refuses it: tests/sdk/)."""
    peer, _ = await ready_peer(alice)
    session = {"instructions": "hi", "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}
    await peer.send({"type": "session.update", "session": session})
    updated = (await peer.until("session.updated"))["session"]
    assert updated["instructions"] == "hi" and updated["duplex"]["mode"] == "duplex"
    await peer.proves_alive()
    await peer.close()


async def test_conversation_items_outside_chat_mode_are_refused_and_the_session_goes_on(alice):
    peer, _ = await ready_peer(alice)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}
    await peer.send({"type": "conversation.item.create", "item": item, "event_id": "chat-1"})
    error = await peer.error()
    assert (error["code"], error["event_id"]) == ("unsupported_mode", "chat-1")
    await peer.proves_alive()
    await peer.close()
