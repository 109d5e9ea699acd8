"""``POST /v1/realtime/calls``: real aiortc callers against the real endpoint, consumer and echo service.

The offer goes through the ASGI application (the Django view, as daphne would run it); audio and events
then flow over real loopback UDP between two aiortc peer connections in this event loop.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from channels.db import database_sync_to_async
from channels.testing import HttpCommunicator

from tests.webapp.realtime.realtime_helpers import make_account, tone
from tests.webapp.webrtc.rtc_client import ArrayMicrophone, rtc_answer, rtc_offer
from webapp.accounts.models import ApiKey
from webapp.accounts.services import apikey_revoke
from webapp.asgi import application
from webapp.conversations.models import Conversation
from webapp.webrtc.call import live_calls

pytestmark = pytest.mark.django_db(transaction=True)


async def post_offer(sdp: str, *, key: str | None, content_type: bytes = b"application/sdp", query: str = ""):
    headers = [(b"content-type", content_type), (b"host", b"127.0.0.1")]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    communicator = HttpCommunicator(
        application, "POST", f"/v1/realtime/calls{query}", body=sdp.encode(), headers=headers
    )
    return await communicator.get_response(timeout=20)


async def call(account, signal: np.ndarray | None = None):
    caller, offer = await rtc_offer(ArrayMicrophone(tone(24_000) if signal is None else signal))
    response = await post_offer(offer, key=account.key)
    assert response["status"] == 201, response["body"]
    headers = {name.lower(): value for name, value in response["headers"]}
    assert headers[b"content-type"] == b"application/sdp"
    assert headers[b"location"].startswith(b"/v1/realtime/calls/rtc_")
    await rtc_answer(caller, response["body"].decode())
    return caller


async def wait_for(condition, wait_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + wait_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def rms(signal: np.ndarray) -> float:
    return float(np.sqrt(np.mean(signal**2))) if len(signal) else 0.0


async def test_a_webrtc_call_echoes_the_caller_over_opus_with_events_on_the_data_channel(inference_service):
    alice = await make_account("alice")
    caller = await call(alice)
    created = await caller.until("session.created")
    session_id = created["session"]["id"]
    assert created["session"]["duplex"]["capabilities"]["engine"] == "echo"
    caller.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
    try:
        updated = await caller.until("session.updated")
    except TimeoutError:
        raise AssertionError([e for e in caller.events if e["type"] == "error"]) from None
    assert updated["session"]["instructions"] == "Be brief."
    await caller.until("response.output_audio_transcript.delta")
    # The echo engine returns the 440 Hz tone: heard through Opus both ways, resampled to 24 kHz and back.
    await wait_for(lambda: rms(caller.heard_audio()[-24_000:]) > 0.1, wait_s=15)
    heard = caller.heard_audio()[-12_000:]
    spectrum = np.abs(np.fft.rfft(heard))
    assert abs(np.argmax(spectrum) * 24_000 / len(heard) - 440) < 10
    assert caller.count("response.output_audio.delta") == 0  # audio rides the track, not the channel
    # input_backpressure: the machine too loaded to keep up in real time says so; nothing else may go wrong
    errors = [e for e in caller.events if e["type"] == "error" and e["error"]["code"] != "input_backpressure"]
    assert errors == []
    row = await database_sync_to_async(Conversation.objects.get)(session_id=session_id)
    assert row.status == Conversation.Status.OPEN
    caller.send({"type": "session.close"})
    assert (await caller.until("session.closed"))["reason"] == "client_close"
    await wait_for(lambda: caller.pc.connectionState == "closed" or not live_calls, wait_s=5)
    await caller.close()


async def test_revoking_the_key_ends_the_webrtc_call(inference_service):
    alice = await make_account("alice")
    caller = await call(alice)
    await caller.until("session.created")
    await wait_for(lambda: rms(caller.heard_audio()[-24_000:]) > 0.1, wait_s=15)
    api_key = await database_sync_to_async(ApiKey.objects.get)(user=alice.user)
    await database_sync_to_async(apikey_revoke)(api_key=api_key)
    assert (await caller.until("session.closed", wait_s=3))["reason"] == "credentials_revoked"
    await wait_for(lambda: not live_calls, wait_s=5)
    await caller.close()
    refused = await post_offer("v=0\r\n", key=alice.key)
    assert refused["status"] == 401


async def test_a_second_webrtc_call_takes_the_session_over(inference_service):
    alice = await make_account("alice")
    first = await call(alice)
    session_id = (await first.until("session.created"))["session"]["id"]
    second = await call(alice)
    assert (await second.until("session.created"))["session"]["id"] == session_id
    await first.until("session.replaced")
    await wait_for(lambda: rms(second.heard_audio()[-24_000:]) > 0.1, wait_s=15)
    for caller in (first, second):
        await caller.close()
    # Both server-side peer connections close: the replaced one after its last events left (CLOSE_FLUSH_S), the
    # other once its caller hung up. (Ending the test while a close was still under way hung the loop's teardown.)
    await wait_for(lambda: not live_calls, wait_s=15)


async def test_refusals_are_typed(inference_service):
    alice = await make_account("alice")
    caller, offer = await rtc_offer(ArrayMicrophone(tone(4800)))
    no_key = await post_offer(offer, key=None)
    assert no_key["status"] == 401
    wrong = await post_offer(offer, key="pk_not-a-key")
    assert wrong["status"] == 401 and b"invalid_api_key" in wrong["body"]
    as_json = await post_offer(offer, key=alice.key, content_type=b"application/json")
    assert as_json["status"] == 415
    garbage = await post_offer("this is not sdp", key=alice.key)
    assert garbage["status"] == 400 and b"invalid_offer" in garbage["body"]
    await caller.close()
    assert not live_calls
