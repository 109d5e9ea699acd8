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


# ---- deactivated without a save signal (a queryset update, raw SQL, a shell) ----------------------------------


def deactivate_without_signal(user) -> None:
    """What ``manage.py shell`` or a bulk job does: no ``save()``, so no post_save and no revocation message."""
    type(user).objects.filter(pk=user.pk).update(is_active=False)


async def test_a_user_deactivated_by_a_queryset_update_loses_the_call_at_the_next_account_check(alice, settings):
    settings.PARLEY_ACCOUNT_CHECK_S = 0.3
    peer, _ = await ready_peer(alice)
    await peer.prime()  # a live call that sends nothing else: no session.update to notice it
    await database_sync_to_async(deactivate_without_signal)(alice.user)
    await assert_ended_for_revocation(peer)
    await assert_refused(key=alice.key)


async def test_a_session_update_from_a_user_deactivated_without_a_signal_ends_the_call_at_once(alice, settings):
    settings.PARLEY_ACCOUNT_CHECK_S = 3600  # the periodic check is far off: the update itself must notice
    peer, _ = await ready_peer(alice)
    await database_sync_to_async(deactivate_without_signal)(alice.user)
    await peer.send({"type": "session.update", "session": {"instructions": "still here?"}})
    await assert_ended_for_revocation(peer)


async def test_an_active_user_keeps_the_call_through_account_checks(alice, settings):
    settings.PARLEY_ACCOUNT_CHECK_S = 0.1
    peer, _ = await ready_peer(alice)
    await asyncio.sleep(0.5)  # several checks
    await peer.proves_alive()
    await peer.close()


async def test_one_read_a_period_checks_every_live_call_of_the_process(settings, django_user_model, monkeypatch):
    """Three calls of two users: one database read a period for all of them, and only the calls of the user
    deactivated end."""
    from webapp.conversations import services
    from webapp.conversations.account_watch import watch_account

    settings.PARLEY_ACCOUNT_CHECK_S = 0.1
    reads: list[list[object]] = []
    real_read = services.active_user_ids

    def counted_read(*, user_ids):
        reads.append(sorted(user_ids))
        return real_read(user_ids=user_ids)

    monkeypatch.setattr(services, "active_user_ids", counted_read)
    make_user = database_sync_to_async(django_user_model.objects.create_user)
    stays, leaves = await make_user(username="stays"), await make_user(username="leaves")
    ended: list[str] = []

    def watch(name: str, user) -> asyncio.Task:
        async def on_inactive() -> None:
            ended.append(name)

        return asyncio.create_task(watch_account(user_id=user.pk, ended=lambda: False, on_inactive=on_inactive))

    calls = [watch("stays", stays), watch("leaves-1", leaves), watch("leaves-2", leaves)]
    await asyncio.sleep(0.35)
    assert 2 <= len(reads) <= 4  # one read a period, not one a call
    assert all(read == sorted([stays.pk, leaves.pk]) for read in reads)
    await database_sync_to_async(deactivate_without_signal)(leaves)
    await asyncio.wait_for(asyncio.gather(calls[1], calls[2]), timeout=2.0)
    assert sorted(ended) == ["leaves-1", "leaves-2"]
    reads.clear()
    await asyncio.sleep(0.25)
    assert reads and all(read == [stays.pk] for read in reads)  # the ended calls are no longer read
    assert not calls[0].done()
    calls[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await calls[0]


async def test_a_read_that_fails_unexpectedly_leaves_the_calls_watched(settings, django_user_model, monkeypatch):
    from webapp.conversations import services
    from webapp.conversations.account_watch import watch_account

    settings.PARLEY_ACCOUNT_CHECK_S = 0.1
    real_read, failures = services.active_user_ids, [RuntimeError("a bug below the read")]

    def read_failing_once(*, user_ids):
        if failures:
            raise failures.pop()
        return real_read(user_ids=user_ids)

    monkeypatch.setattr(services, "active_user_ids", read_failing_once)
    user = await database_sync_to_async(django_user_model.objects.create_user)(username="watched")
    ended = asyncio.Event()

    async def on_inactive() -> None:
        ended.set()

    call = asyncio.create_task(watch_account(user_id=user.pk, ended=lambda: False, on_inactive=on_inactive))
    await asyncio.sleep(0.25)  # the first read failed (logged), the next ones read again
    assert not failures and not call.done()
    await database_sync_to_async(deactivate_without_signal)(user)
    await asyncio.wait_for(ended.wait(), timeout=2.0)
    await call


@pytest.fixture(scope="module")
def checking_server(django_db_setup, django_db_blocker):
    """A real daphne whose calls re-read their user every 0.3 s (the setting is forked into the server)."""
    from django.test import override_settings

    from tests.live_server import live_server_env, run_live_server

    with (
        override_settings(PARLEY_ACCOUNT_CHECK_S=0.3),
        run_live_server(django_db_blocker, live_server_env("echo")) as server,
    ):
        yield server


def test_on_a_real_server_a_call_ends_once_its_user_is_deactivated_without_a_signal(checking_server, django_user_model):
    import contextlib
    import json

    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from webapp.accounts.services import apikey_create

    user = django_user_model.objects.create_user(username="shelled", password="pw-for-tests-only")
    _, key = apikey_create(user=user, name="test")

    async def call() -> tuple[str, int | None]:
        headers = {"Authorization": f"Bearer {key}"}
        async with connect(f"{checking_server.ws_url}/v1/realtime?model=echo", additional_headers=headers) as ws:
            reason = None
            with contextlib.suppress(ConnectionClosed):  # 4401 is not a normal close
                async for message in ws:
                    event = json.loads(message) if isinstance(message, str) else {}
                    if event.get("type") == "session.created":
                        await asyncio.to_thread(deactivate_without_signal, user)
                    elif event.get("type") == "session.closed":
                        reason = event["reason"]
            return reason, ws.close_code

    assert asyncio.run(asyncio.wait_for(call(), 20)) == ("credentials_revoked", 4401)
