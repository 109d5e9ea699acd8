"""Per-IP limits behind the shipped nginx: a client's own ``X-Forwarded-For`` buys it nothing.

A real nginx from ``deploy/nginx.conf.template`` in front of a real daphne running the app as the
systemd unit runs it. Clients reach nginx from distinct loopback addresses (127.0.0.x), so nginx
sees each one's true address: an attacker writing a random ``X-Forwarded-For`` on every request
must still be locked out / throttled, and a second client must not be (which rules out counting
everyone as nginx's own address).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import re
from pathlib import Path

import pytest
from django.test import override_settings
from websockets.asyncio.client import connect

from tests.cluster.nginx import start_nginx
from tests.live_server import live_server_env, run_live_server
from webapp.common.forwarded import client_address

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def behind_nginx(django_db_setup, django_db_blocker):
    # The forked server keeps these overrides: low limits in the server process only.
    # Connects without credentials count as failed authentications: the same per-address limit as wrong keys.
    limits = override_settings(PARLEY_KEY_FAILURE_RATE="3/minute")
    with limits, run_live_server(django_db_blocker, live_server_env("echo")) as server:
        with start_nginx([server.host]) as nginx:
            yield nginx


def random_xff() -> str:
    return f"{random.randint(1, 223)}.{random.randint(0, 255)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


class Browser:
    """An HTTP client at one loopback source address, keeping its cookies."""

    def __init__(self, port: int, source: str):
        self.port, self.source, self.cookies = port, source, {}

    def request(self, method: str, path: str, body: dict | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30, source_address=(self.source, 0))
        sent = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        encoded = None
        if body is not None:
            from urllib.parse import urlencode

            encoded = urlencode(body)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            conn.request(method, path, body=encoded, headers=sent)
            response = conn.getresponse()
            content = response.read()
        finally:
            conn.close()
        for value in response.headers.get_all("Set-Cookie") or []:
            name, _, rest = value.partition("=")
            self.cookies[name.strip()] = rest.split(";", 1)[0]
        return response.status, content

    def login(self, username: str, password: str, xff: str | None = None) -> int:
        status, page = self.request("GET", "/accounts/login/")
        assert status == 200, page[:300]
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1).decode()
        form = {"username": username, "password": password, "csrfmiddlewaretoken": token}
        status, _ = self.request("POST", "/accounts/login/", form, {"X-Forwarded-For": xff} if xff else None)
        return status


def test_random_forwarded_for_still_hits_the_login_lockout(behind_nginx, django_user_model, settings):
    django_user_model.objects.create_user(username="bob", password="right-password-for-bob")
    attacker = Browser(behind_nginx.port, "127.0.0.2")
    statuses = [attacker.login("bob", "wrong", xff=random_xff()) for _ in range(settings.AXES_FAILURE_LIMIT)]
    assert statuses[:-1] == [200] * (settings.AXES_FAILURE_LIMIT - 1) and statuses[-1] == 429, statuses
    assert attacker.login("bob", "right-password-for-bob", xff=random_xff()) == 429  # locked out, right password too
    # Another address (through the same nginx) is a different client: it logs in.
    assert Browser(behind_nginx.port, "127.0.0.3").login("bob", "right-password-for-bob") == 302


def test_random_forwarded_for_still_hits_the_metrics_key_throttle(behind_nginx):
    def scrape(source: str, xff: str | None) -> int:
        headers = {"Authorization": "Bearer pk_guess"} | ({"X-Forwarded-For": xff} if xff else {})
        return Browser(behind_nginx.port, source).request("GET", "/ops/metrics", headers=headers)[0]

    assert [scrape("127.0.0.4", random_xff()) for _ in range(3)] == [403] * 3
    assert scrape("127.0.0.4", random_xff()) == 429
    assert scrape("127.0.0.5", None) == 403  # a wrong key from elsewhere is refused, not throttled


def test_random_forwarded_for_still_hits_the_connect_throttle(behind_nginx):
    async def first_error(source: str, xff: str | None) -> str:
        headers = {"Origin": f"http://127.0.0.1:{behind_nginx.port}"} | ({"X-Forwarded-For": xff} if xff else {})
        async with connect(
            f"{behind_nginx.ws_url}/v1/realtime", additional_headers=headers, local_addr=(source, 0)
        ) as ws:
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if event["type"] == "error":
                    return event["error"]["code"]

    async def run() -> None:
        codes = [await first_error("127.0.0.6", random_xff()) for _ in range(4)]
        assert codes == ["forbidden"] * 3 + ["rate_limit_exceeded"], codes
        assert await first_error("127.0.0.7", None) == "forbidden"

    asyncio.run(run())


@pytest.mark.parametrize(
    ("peer", "header", "expected"),
    [
        ("203.0.113.5", ["198.51.100.1"], "203.0.113.5"),  # not from a proxy: the header is the client's say
        ("127.0.0.1", ["6.6.6.6, 203.0.113.5"], "203.0.113.5"),  # the rightmost hop the proxy saw
        ("127.0.0.1", ["6.6.6.6", "203.0.113.5, 127.0.0.1"], "203.0.113.5"),  # a trusted hop is skipped
        ("127.0.0.1", ["127.0.0.1"], "127.0.0.1"),  # every hop trusted: a request from the proxy's own host
        ("127.0.0.1", [" , "], "127.0.0.1"),
    ],
)
def test_the_client_is_the_rightmost_hop_no_trusted_proxy_vouches_beyond(peer, header, expected):
    assert client_address(peer, header, ("127.0.0.1", "::1")) == expected


def test_the_shipped_proxy_and_units_set_the_header_the_app_expects():
    for site in ("deploy/nginx.conf.template", "deploy/nginx/parley.conf"):
        text = (ROOT / site).read_text()
        assert "$proxy_add_x_forwarded_for" not in text and "X-Forwarded-For $remote_addr" in text, site
    unit = (ROOT / "deploy/systemd/parley-daphne@.service").read_text()
    assert "--proxy-headers" not in next(line for line in unit.splitlines() if line.startswith("ExecStart="))
