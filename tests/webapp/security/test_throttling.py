"""Finding 5: throttles on logins (django-axes), on WebSocket connects (per user and per API key) and on
failed authentications (per client IP)."""

import pytest
from channels.db import database_sync_to_async
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.test import Client, override_settings

from tests.webapp.realtime.realtime_helpers import Peer, make_account, session_cookie_for
from webapp.asgi import application
from webapp.common import throttling
from webapp.env import WebEnv

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
async def fresh_counts():
    await throttling.reset()
    yield
    await throttling.reset()


def default(name: str):
    """A setting's shipped default (the test settings raise the limits for the rest of the suite)."""
    return WebEnv.model_fields[name].default


SHIPPED_LIMITS = override_settings(
    PARLEY_CONNECTS_PER_USER_PER_MINUTE=default("connects_per_user_per_minute"),
    PARLEY_CONNECTS_PER_KEY_PER_MINUTE=default("connects_per_key_per_minute"),
    PARLEY_KEY_FAILURE_RATE=default("key_failure_rate"),
)


async def connect(*, ip: str = "203.0.113.7", key: str | None = None, cookie: str | None = None) -> Peer:
    headers = [(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000")]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    if cookie is not None:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    comm = WebsocketCommunicator(application, "/v1/realtime", headers=headers)
    comm.scope["client"] = [ip, 50000]
    connected, code = await comm.connect(timeout=5)
    assert connected, code
    return Peer(comm)


async def assert_throttled(peer: Peer, what: str) -> None:
    error = await peer.error()
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_error"
    assert what in error["message"] and "try again in" in error["message"]
    assert (await peer.until("closed"))["code"] == 4429


async def admitted(peer: Peer) -> None:
    """The first event is an admission (a slot or a place in the queue), not a refusal; then hang up."""
    first = await peer.next(10)
    assert isinstance(first, dict) and first["type"] in ("session.created", "session.queued"), first
    await peer.close()


@SHIPPED_LIMITS
async def test_fifty_signed_in_callers_from_one_address_all_connect_within_a_minute(inference_service):
    """An office behind one NAT: browsers (cookies) and scripts (keys), one address. Was: callers 31-50 refused."""
    await inference_service(slots=4, queue_max=64)
    for n in range(50):
        account = await make_account(f"office-{n}")
        if n % 2:
            await admitted(await connect(key=account.key))
        else:
            await admitted(await connect(cookie=await session_cookie_for(account.user)))


@SHIPPED_LIMITS
async def test_150_open_close_cycles_with_one_key_are_not_refused_at_the_default_limit(inference_service):
    account = await make_account("cycler")
    for _ in range(150):  # was: 29 worked, 121 were refused
        peer = await connect(key=account.key)
        await peer.until("session.created")
        await peer.close()


@SHIPPED_LIMITS
async def test_connects_without_credentials_from_one_address_are_throttled_as_failed_authentication(
    inference_service,
):
    failures = int(default("key_failure_rate").split("/")[0])
    for _ in range(failures):
        assert (await (await connect()).error())["code"] == "forbidden"
    await assert_throttled(await connect(), "unauthenticated connects")
    account = await make_account("alice")
    await assert_throttled(await connect(key=account.key), "from your address")  # the address is locked out
    peer = await connect(ip="198.51.100.9", key=account.key)  # another address is not affected
    await peer.until("session.created")
    await peer.close()


@override_settings(PARLEY_CONNECTS_PER_KEY_PER_MINUTE=3, PARLEY_CONNECTS_PER_USER_PER_MINUTE=2)
async def test_connects_past_the_per_key_and_per_user_limits_get_a_clear_error_and_4429(inference_service):
    account = await make_account("alice")
    for n in range(3):  # each from another address: the count follows the key, not the address
        peer = await connect(ip=f"198.51.100.{n + 1}", key=account.key)
        await peer.until("session.created")
        await peer.close()
    await assert_throttled(await connect(ip="198.51.100.9", key=account.key), "Too many connections with this API key")
    cookie = await session_cookie_for(account.user)  # the same user's browser counts on its own
    for _ in range(2):
        peer = await connect(cookie=cookie)
        await peer.until("session.created")
        await peer.close()
    await assert_throttled(await connect(cookie=cookie), "Too many connections with this account")


@override_settings(PARLEY_KEY_FAILURE_RATE="3/minute")
async def test_wrong_api_keys_past_the_per_ip_rate_lock_that_ip_out_even_with_a_right_key(inference_service):
    account = await make_account("alice")
    for attempt in range(3):
        peer = await connect(key=f"pk_guess-{attempt}")
        assert (await peer.error())["code"] == "forbidden"
    await assert_throttled(await connect(key=account.key), "Too many wrong API keys")
    peer = await connect(ip="198.51.100.9", key=account.key)
    await peer.until("session.created")
    await peer.close()


async def test_right_keys_do_not_count_against_the_key_rate(inference_service):
    account = await make_account("alice")
    with override_settings(PARLEY_KEY_FAILURE_RATE="2/minute"):
        for _ in range(4):
            peer = await connect(key=account.key)
            await peer.until("session.created")
            await peer.close()


@pytest.mark.django_db
def test_logins_are_locked_out_per_ip_after_the_failure_limit(django_user_model, settings):
    django_user_model.objects.create_user(username="bob", password="right-password-for-bob")
    client = Client(REMOTE_ADDR="203.0.113.8")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = client.post("/accounts/login/", {"username": "bob", "password": "wrong"})
        assert response.status_code == 200 and b"did not match" in response.content
    locked = client.post("/accounts/login/", {"username": "bob", "password": "wrong"})
    assert locked.status_code == 429 and b"Too many failed logins" in locked.content
    # Locked out: even the right password is refused, before any password hash is computed.
    refused = client.post("/accounts/login/", {"username": "bob", "password": "right-password-for-bob"})
    assert refused.status_code == 429
    # Another address still logs in.
    other = Client(REMOTE_ADDR="198.51.100.10")
    ok = other.post("/accounts/login/", {"username": "bob", "password": "right-password-for-bob"})
    assert ok.status_code == 302


async def test_counts_live_in_redis_when_the_deployment_has_one(inference_service, redis_server):
    """With REDIS_URL every web process counts in the same place (here: a real throwaway Redis)."""
    import redis

    storage = f"async+{redis_server.url}"
    account = await make_account("alice")
    with override_settings(PARLEY_RATE_LIMIT_STORAGE=storage, PARLEY_CONNECTS_PER_KEY_PER_MINUTE=2):
        await throttling.reset()
        for _ in range(2):
            peer = await connect(key=account.key)
            await peer.until("session.created")
            await peer.close()
        await assert_throttled(await connect(key=account.key), "Too many connections")
        keys = redis.Redis.from_url(redis_server.url).keys("*connect*key*")
        assert keys, "the connect count is not in Redis"
        await throttling.reset()


async def scrape(ip: str, key: str) -> dict:
    """GET /ops/metrics through the ASGI application, as a client at ``ip``."""
    comm = HttpCommunicator(
        application,
        "GET",
        "/ops/metrics",
        headers=[(b"host", b"127.0.0.1:8000"), (b"authorization", f"Bearer {key}".encode())],
    )
    comm.scope["client"] = [ip, 50000]
    return await comm.get_response(timeout=30)


async def test_wrong_api_keys_on_the_metrics_endpoint_count_too_and_get_429(inference_service):
    account = await make_account("scraper")

    @database_sync_to_async
    def make_scraper():
        account.user.user_permissions.add(*Permission.objects.filter(codename="view_console"))
        type(account.user).objects.filter(pk=account.user.pk).update(is_staff=True)

    await make_scraper()
    with override_settings(PARLEY_KEY_FAILURE_RATE="2/minute"):
        for attempt in range(2):
            assert (await scrape("203.0.113.9", f"pk_guess-{attempt}"))["status"] == 403
        locked = await scrape("203.0.113.9", account.key)  # the right key, but from the guessing address
        assert locked["status"] == 429 and b"Too many wrong API keys" in locked["body"]
        assert int(dict((k.lower(), v) for k, v in locked["headers"])[b"retry-after"]) > 0
        ok = await scrape("198.51.100.11", account.key)
        assert ok["status"] == 200 and b"parley_" in ok["body"]


def test_the_in_process_counts_outlive_the_event_loop_that_made_them(settings):
    """The in-memory storage's key locks bind to the event loop that waited on them (a test's, or a sync caller's
    throwaway loop). A lock left held there must not break the next loop's counting, nor lose its counts."""
    import asyncio

    settings.PARLEY_RATE_LIMIT_STORAGE = "async+memory://"
    settings.PARLEY_KEY_FAILURE_RATE = "2/minute"
    ip = "198.51.100.23"

    async def count_then_strand_the_locks():
        await throttling.reset()
        await throttling.record_key_failure(ip)
        for lock in list(throttling._current().storage.locks.values()):
            await lock.acquire()  # held, never released
            waiter = asyncio.ensure_future(lock.acquire())  # a waiter binds the lock to this loop
            await asyncio.sleep(0)
            waiter.cancel()

    async def count_again():
        await throttling.record_key_failure(ip)  # was: RuntimeError, the lock is bound to another loop
        return await throttling.key_refusal(ip)

    asyncio.run(count_then_strand_the_locks())
    refusal = asyncio.run(count_again())
    assert refusal is not None, "the first loop's count was lost"
    asyncio.run(throttling.reset())
