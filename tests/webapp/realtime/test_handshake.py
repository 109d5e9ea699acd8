"""Authentication and origin rules of the /v1/realtime handshake, and session.created."""

import pytest

from tests.webapp.realtime.realtime_helpers import ALLOWED_ORIGIN, open_peer, ready_peer, session_cookie_for

pytestmark = pytest.mark.django_db(transaction=True)


async def test_no_credentials_gets_forbidden_and_4401_then_a_key_works(alice):
    peer, connected, _ = await open_peer(origin=ALLOWED_ORIGIN)  # a browser that is not logged in
    assert connected  # accepted only to say why: nothing is allocated
    error = await peer.error()
    assert error["code"] == "forbidden"
    assert (await peer.until("closed"))["code"] == 4401

    peer, _ = await ready_peer(alice)
    await peer.proves_alive()
    await peer.close()


async def test_wrong_or_revoked_key_is_refused(alice):
    peer, connected, _ = await open_peer(key="pk_not-a-real-key")
    assert connected
    error = await peer.error()
    assert error["code"] == "forbidden" and "API key is not valid" in error["message"]  # not "log in or send a key"
    assert (await peer.until("closed"))["code"] == 4401

    from channels.db import database_sync_to_async

    from webapp.accounts.models import ApiKey

    await database_sync_to_async(ApiKey.objects.filter(user=alice.user).update)(revoked_at="2026-01-01T00:00Z")
    peer, connected, _ = await open_peer(key=alice.key)
    assert (await peer.error())["code"] == "forbidden"
    assert (await peer.until("closed"))["code"] == 4401


async def test_foreign_origin_is_refused_at_the_handshake(alice):
    cookie = await session_cookie_for(alice.user)
    peer, connected, _ = await open_peer(cookie=cookie, origin=b"http://evil.example")
    assert not connected
    # ...even with a valid key: a browser page on another site must not use it.
    peer, connected, _ = await open_peer(key=alice.key, origin=b"https://evil.example")
    assert not connected


async def test_cookie_without_origin_is_refused(alice):
    cookie = await session_cookie_for(alice.user)
    peer, connected, _ = await open_peer(cookie=cookie)
    assert not connected


async def test_logged_in_browser_gets_session_created(alice):
    cookie = await session_cookie_for(alice.user)
    peer, created = await ready_peer_cookie(cookie)
    assert created["session"]["id"].startswith("sess_")
    await peer.proves_alive()
    await peer.close()


async def ready_peer_cookie(cookie):
    peer, connected, code = await open_peer(cookie=cookie, origin=ALLOWED_ORIGIN)
    assert connected, code
    return peer, await peer.until("session.created")


async def test_session_created_carries_capabilities_and_sequence(alice):
    peer, created = await ready_peer(alice)
    session = created["session"]
    assert session["object"] == "realtime.session" and session["type"] == "realtime"
    assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    caps = session["duplex"]["capabilities"]
    assert caps["engine"] == "echo"
    assert caps["chunk_period_ms"] == 80
    assert caps["output_rate"] == 24000
    assert 16000 in caps["input_rates"] and 24000 in caps["input_rates"]
    for name in ("video", "barge_in", "pause", "resume", "max_session_s"):
        assert name in caps
    assert session["duplex"]["resumed"] is False
    assert "resumed" not in created

    await peer.send({"type": "session.update", "session": {"instructions": "Be brief."}})
    updated = await peer.until("session.updated")
    assert updated["session"]["instructions"] == "Be brief."
    events = [e for e in peer.seen if isinstance(e, dict)]
    seqs = [e["server_event_seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] >= 1
    assert all(e["event_id"].startswith("event_") for e in events)
    await peer.close()
