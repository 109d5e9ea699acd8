"""Finding 3: revoking a key or deactivating a user ends the live call at once and refuses reconnects."""

import asyncio

import pytest
from channels.db import database_sync_to_async

from tests.webapp.realtime.realtime_helpers import ALLOWED_ORIGIN, open_peer, ready_peer, session_cookie_for
from webapp.accounts.models import ApiKey
from webapp.accounts.services import apikey_create, apikey_revoke
from webapp.conversations.models import Conversation

pytestmark = pytest.mark.django_db(transaction=True)


async def assert_ended_for_revocation(peer) -> None:
    closed = await peer.until("session.closed", wait_s=3.0)  # at once, not after the max session length
    assert closed["reason"] == "credentials_revoked"
    assert (await peer.until("closed"))["code"] == 4401


async def assert_refused(**credentials) -> None:
    peer, connected, _ = await open_peer(**credentials)
    assert connected  # accepted only to say why
    assert (await peer.error())["code"] == "forbidden"
    assert (await peer.until("closed"))["code"] == 4401


async def test_revoking_the_key_ends_its_live_call_and_refuses_it_again(alice):
    peer, _ = await ready_peer(alice)
    await peer.prime()  # audio flowing: a live call
    api_key = await database_sync_to_async(ApiKey.objects.get)(user=alice.user)
    await database_sync_to_async(apikey_revoke)(api_key=api_key)
    await assert_ended_for_revocation(peer)
    await assert_refused(key=alice.key)


async def test_revoking_another_key_of_the_same_user_leaves_this_call_alone(alice):
    spare, _ = await database_sync_to_async(apikey_create)(user=alice.user, name="spare")
    peer, _ = await ready_peer(alice)
    await database_sync_to_async(apikey_revoke)(api_key=spare)
    await peer.proves_alive()
    await peer.close()


async def test_deactivating_the_user_ends_a_browser_call_and_refuses_the_cookie_and_the_key(alice):
    cookie = await session_cookie_for(alice.user)
    peer, connected, code = await open_peer(cookie=cookie, origin=ALLOWED_ORIGIN)
    assert connected, code
    await peer.until("session.created")
    alice.user.is_active = False
    await database_sync_to_async(alice.user.save)()
    await assert_ended_for_revocation(peer)
    await assert_refused(cookie=cookie, origin=ALLOWED_ORIGIN)
    await assert_refused(key=alice.key)


async def test_deleting_the_user_ends_the_call(alice):
    peer, _ = await ready_peer(alice)
    await peer.prime()
    # The call's row is written just after session.created: delete the user once it is there.
    for _ in range(100):
        if await database_sync_to_async(Conversation.objects.filter(user=alice.user).exists)():
            break
        await asyncio.sleep(0.05)
    await database_sync_to_async(alice.user.delete)()
    await assert_ended_for_revocation(peer)
