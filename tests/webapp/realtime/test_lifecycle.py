"""Session lifetime over sockets: takeover, resume, queue, close, cancel, pause, metrics, rows."""

import asyncio
import gc
import weakref

import pytest
from channels.db import database_sync_to_async

from inference.session.dialogue import DialogueSession
from tests.webapp.realtime.realtime_helpers import FRAME, make_account, open_peer, ready_peer, to_pcm16, tone
from webapp.conversations.consumers import RealtimeConsumer
from webapp.conversations.models import Conversation

pytestmark = pytest.mark.django_db(transaction=True)


@database_sync_to_async
def conversation(session_id: str) -> Conversation:
    return Conversation.objects.get(session_id=session_id)


async def eventually(predicate, wait_s: float = 3.0):
    """Poll an async predicate: rows are written just after the events that announce them."""
    for _ in range(int(wait_s / 0.05)):
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return await predicate()


async def test_second_socket_of_a_user_takes_the_session_over(alice):
    first, created = await ready_peer(alice)
    await first.prime()
    second, taken = await ready_peer(alice)
    assert taken["session"]["id"] == created["session"]["id"]  # the same model state continues
    assert taken["resumed"] is True and taken["session"]["duplex"]["resumed"] is True
    await first.until("session.replaced")
    assert (await first.until("closed"))["code"] == 4409
    await second.proves_alive()
    await second.close()


async def test_reconnect_after_a_drop_resumes_the_session(alice):
    first, created = await ready_peer(alice)
    await first.prime()
    session_id = created["session"]["id"]
    await first.close()  # the socket drops: the session waits, paused, for the grace period

    async def detached():
        return (await conversation(session_id)).status == Conversation.Status.DETACHED

    assert await eventually(detached)
    second, resumed = await ready_peer(alice)
    assert resumed["session"]["id"] == session_id and resumed["resumed"] is True
    assert (await conversation(session_id)).status == Conversation.Status.OPEN
    await second.proves_alive()
    await second.close()


async def test_queue_with_one_slot_admits_the_next_user_when_the_first_closes(inference_service):
    await inference_service(slots=1, queue_max=1)
    alice, bob = await make_account("alice"), await make_account("bob")
    first, _ = await ready_peer(alice)
    second, connected, _ = await open_peer(key=bob.key)
    assert connected
    queued = await second.until("session.queued")
    assert (queued["position"], queued["queue_length"]) == (1, 1)
    assert queued["estimated_wait_s"] >= 0

    await first.send({"type": "session.close"})
    assert (await first.until("session.closed"))["reason"] == "client_close"
    assert (await first.until("closed"))["code"] == 1000

    created = await second.until("session.created", wait_s=10)
    assert created["session"]["id"].startswith("sess_")
    await second.proves_alive()
    await second.close()


async def test_session_close_ends_the_session_and_records_it(alice):
    peer, created = await ready_peer(alice)
    session_id = created["session"]["id"]
    assert (await conversation(session_id)).status == Conversation.Status.OPEN
    await peer.prime()
    await peer.send({"type": "session.close"})
    closed = await peer.until("session.closed")
    assert closed["reason"] == "client_close"
    assert (await peer.until("closed"))["code"] == 1000
    row = await conversation(session_id)
    assert (row.status, row.close_reason, row.engine) == (Conversation.Status.CLOSED, "client_close", "echo")
    assert row.ended_at is not None and row.user_id == alice.user.pk

    again, created_again = await ready_peer(alice)  # a closed session is not resumed
    assert created_again["session"]["id"] != session_id and "resumed" not in created_again
    await again.close()


@pytest.mark.parametrize("ending", ["session.close", "socket closed"])
async def test_an_ended_call_leaves_nothing_for_the_cycle_collector(alice, monkeypatch, ending):
    """A call's consumer goes when its connection does, and a closed call's session with it: its ended tasks kept
    their frames, the frames the consumer; the session and its handle held each other. Each call waited for the
    interpreter's full collection, hundreds of calls apart in a busy web process (its RSS rose ~200 MB first)."""
    consumers: list[weakref.ref] = []
    sessions: list[weakref.ref] = []
    for cls, made_ones in ((RealtimeConsumer, consumers), (DialogueSession, sessions)):

        def tracked(self, *args, _made=cls.__init__, _into=made_ones, **kwargs):
            _made(self, *args, **kwargs)
            _into.append(weakref.ref(self))

        monkeypatch.setattr(cls, "__init__", tracked)
    gc.collect()
    gc.disable()
    try:
        peer, _ = await ready_peer(alice)
        await peer.prime()
        if ending == "session.close":
            await peer.send({"type": "session.close"})
            await peer.until("closed")
        await peer.close()  # the client's side of the closing handshake (daphne's websocket.disconnect)
        del peer

        async def gone():
            return all(c() is None for c in consumers)

        assert len(consumers) == 1
        assert await eventually(gone), [type(r).__qualname__ for r in gc.get_referrers(consumers[0]())]
        assert len(sessions) == 1
        if ending == "session.close":  # a socket that just closed leaves its session paused for the grace period
            assert sessions[0]() is None, [type(r).__qualname__ for r in gc.get_referrers(sessions[0]())]
    finally:
        gc.enable()


async def test_response_cancel_ends_the_response_and_the_next_audio_opens_a_new_one(alice):
    peer, _ = await ready_peer(alice)
    await peer.prime()
    deltas = [e for e in peer.seen if isinstance(e, dict) and e["type"] == "response.output_audio.delta"]
    first_response = deltas[0]["response_id"]
    await peer.send({"type": "response.cancel"})
    done = await peer.until("response.done")
    assert done["response"]["id"] == first_response and done["response"]["status"] == "cancelled"
    await peer.append(to_pcm16(tone(FRAME * 2)))
    created = await peer.until("response.created")
    assert created["response"]["id"] != first_response
    delta = await peer.until("response.output_audio.delta")
    assert delta["response_id"] == created["response"]["id"]
    types = [e["type"] for e in peer.seen if isinstance(e, dict)]
    cancel_at = types.index("response.done")
    assert types[cancel_at - 4 : cancel_at] == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    await peer.close()


async def test_pause_and_resume(alice):
    peer, _ = await ready_peer(alice)
    await peer.prime()
    await peer.send({"type": "session.pause"})
    await peer.until("session.paused")
    await peer.send({"type": "session.resume"})
    await peer.until("session.resumed")
    await peer.proves_alive()
    await peer.close()


async def test_metrics_arrive_about_once_a_second(alice):
    peer, _ = await ready_peer(alice)
    await peer.prime()
    metrics = (await peer.until("session.metrics", wait_s=3))["metrics"]
    assert "frames_in" in metrics and "frames_out" in metrics
    await peer.close()


async def test_stock_client_events_are_accepted(alice):
    """input_audio_buffer.commit/clear and response.create are meaningless for a duplex model but harmless."""
    peer, _ = await ready_peer(alice)
    await peer.send({"type": "input_audio_buffer.commit"})
    await peer.until("input_audio_buffer.committed")
    await peer.send({"type": "input_audio_buffer.clear"})
    await peer.until("input_audio_buffer.cleared")
    await peer.send({"type": "response.create"})
    await peer.proves_alive()
    assert not any(isinstance(e, dict) and e["type"] == "error" for e in peer.seen)
    await peer.close()


async def test_after_the_grace_period_a_new_session_starts_and_the_old_row_is_closed(inference_service):
    await inference_service(disconnect_grace_s=0.5)
    alice = await make_account("alice")
    first, created = await ready_peer(alice)
    await first.prime()
    await first.close()
    await asyncio.sleep(1.0)  # the grace period passes with no socket attached
    second, fresh = await ready_peer(alice)
    assert fresh["session"]["id"] != created["session"]["id"] and "resumed" not in fresh
    old = await conversation(created["session"]["id"])
    assert (old.status, old.close_reason) == (Conversation.Status.CLOSED, "superseded") and old.ended_at
    assert (await conversation(fresh["session"]["id"])).status == Conversation.Status.OPEN
    await second.proves_alive()
    await second.close()
