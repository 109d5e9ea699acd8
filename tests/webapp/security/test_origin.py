"""Finding 2: the WebSocket Origin check compares the whole origin (scheme, host, port)."""

import pytest
from django.test import override_settings

from tests.webapp.realtime.realtime_helpers import ALLOWED_ORIGIN, open_peer, session_cookie_for
from webapp.conversations.auth import normalized_origin

pytestmark = pytest.mark.django_db(transaction=True)

# Other apps on the same machine: same host name, another port or scheme. All carry the cookie.
FOREIGN_ORIGINS = [
    b"http://127.0.0.1:9999",
    b"http://localhost:3000",
    b"https://127.0.0.1:8000",
    b"http://localhost:8000",  # an allowed host name, but not the origin the socket was opened on
    b"http://127.0.0.1",
    b"null",
]


@pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
async def test_cookie_from_another_origin_on_the_same_host_is_refused(alice, origin):
    cookie = await session_cookie_for(alice.user)
    peer, connected, _ = await open_peer(cookie=cookie, origin=origin)
    assert not connected, origin


async def test_the_sites_own_origin_opens_a_session(alice):
    cookie = await session_cookie_for(alice.user)
    peer, connected, code = await open_peer(cookie=cookie, origin=ALLOWED_ORIGIN)
    assert connected, code
    assert (await peer.until("session.created"))["session"]["id"].startswith("sess_")
    await peer.close()


async def test_an_explicitly_allowed_origin_opens_a_session_and_only_that_one(alice):
    cookie = await session_cookie_for(alice.user)
    with override_settings(PARLEY_ALLOWED_ORIGINS=["https://app.example.com:8443"]):
        peer, connected, code = await open_peer(cookie=cookie, origin=b"https://app.example.com:8443")
        assert connected, code
        await peer.until("session.created")
        await peer.close()
        peer, connected, _ = await open_peer(cookie=cookie, origin=b"https://app.example.com")
        assert not connected


def test_origins_are_compared_whole_with_default_ports_folded():
    assert normalized_origin("HTTP://LocalHost:80") == "http://localhost"
    assert normalized_origin("https://example.com:443/") == "https://example.com"
    assert normalized_origin("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert normalized_origin("http://[::1]:8000") == "http://[::1]:8000"
    for bad in ("null", "file://", "ws://127.0.0.1:8000", "http://user@host", "http://host:99999", "http://h/x"):
        assert normalized_origin(bad) is None, bad
