"""A client secret on ``POST /v1/realtime/calls``: an aiortc caller, the real endpoint, consumer and echo service.

The secret is minted through the application (``POST /v1/realtime/client_secrets``); the WebRTC call it opens
gets the minted session, cannot widen it over the data channel, spends the secret, and ends when the minting
key is revoked, as a WebSocket session opened with it does (tests/webapp/realtime/test_client_secrets_live.py).
"""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import HttpCommunicator

from tests.webapp.realtime.realtime_helpers import make_account, tone
from tests.webapp.webrtc.rtc_client import ArrayMicrophone, rtc_answer, rtc_offer
from tests.webapp.webrtc.test_calls import post_offer, wait_for
from webapp.accounts.models import ApiKey
from webapp.accounts.services import apikey_revoke
from webapp.asgi import application
from webapp.webrtc.call import live_calls

pytestmark = pytest.mark.django_db(transaction=True)


async def mint(key: str, session: dict) -> str:
    headers = [
        (b"content-type", b"application/json"),
        (b"host", b"127.0.0.1"),
        (b"authorization", f"Bearer {key}".encode()),
    ]
    body = json.dumps({"expires_after": {"anchor": "created_at", "seconds": 60}, "session": session}).encode()
    communicator = HttpCommunicator(application, "POST", "/v1/realtime/client_secrets", body=body, headers=headers)
    response = await communicator.get_response(timeout=20)
    assert response["status"] == 200, response["body"]
    return json.loads(response["body"])["value"]


async def test_a_client_secret_opens_one_scoped_webrtc_call_that_dies_with_its_key(inference_service):
    alice = await make_account("alice")
    secret = await mint(alice.key, {"instructions": "Only trains.", "duplex": {"record": False}})
    caller, offer = await rtc_offer(ArrayMicrophone(tone(24_000)))
    response = await post_offer(offer, key=secret)
    assert response["status"] == 201, response["body"]
    await rtc_answer(caller, response["body"].decode())
    created = (await caller.until("session.created"))["session"]
    assert created["instructions"] == "Only trains." and created["duplex"]["record"] is False

    caller.send({"type": "session.update", "session": {"duplex": {"record": True}}})
    error = (await caller.until("error"))["error"]
    assert (error["code"], error["param"]) == ("client_secret_scope", "session.duplex.record")

    again, offer_again = await rtc_offer(ArrayMicrophone(tone(4800)))
    assert (await post_offer(offer_again, key=secret))["status"] == 401  # spent
    await again.close()

    api_key = await database_sync_to_async(ApiKey.objects.get)(user=alice.user)
    await database_sync_to_async(apikey_revoke)(api_key=api_key)
    assert (await caller.until("session.closed", wait_s=3))["reason"] == "credentials_revoked"
    await wait_for(lambda: not live_calls, wait_s=5)
    await caller.close()
