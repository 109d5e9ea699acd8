"""``POST /v1/realtime/client_secrets`` and the sockets its secrets open, on a real daphne.

Each property the endpoint promises is checked end to end with real HTTP and real WebSockets: the GA
shape, a configurable lifetime, one use, the minted session configuration applied and not widenable,
the browser's subprotocol form (from another origin) and Bearer, and revocation with the key.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import time
import urllib.error
import urllib.request
from datetime import timedelta

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.live_server import live_server_env, run_live_server
from webapp.accounts.models import ApiKey
from webapp.accounts.services import apikey_create
from webapp.conversations.models import ClientSecret

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "pw-for-tests-only"
APP_ORIGIN = "http://app.example.test:5173"  # a page of another site, holding only the secret
TTL_S, MAX_TTL_S = 30, 60


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    """Echo engine; secrets live 30 s unless asked otherwise, at most 60 s (the child keeps these settings)."""
    with override_settings(PARLEY_CLIENT_SECRET_TTL_S=TTL_S, PARLEY_CLIENT_SECRET_MAX_TTL_S=MAX_TTL_S):
        with run_live_server(django_db_blocker, live_server_env("echo")) as live:
            yield live


def user_and_key(name: str):
    user = get_user_model().objects.create_user(username=name, password=PASSWORD)
    return user, apikey_create(user=user, name="secrets")[1]


def mint(server, key: str | None, body: object = None, *, method: str = "POST") -> tuple[int, dict]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(f"{server.url}/v1/realtime/client_secrets", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def browser_socket(server, secret: str):
    """What ``@openai/agents-realtime`` does in a page: the secret as a subprotocol, the page's own Origin."""
    protocols = ["realtime", f"openai-insecure-api-key.{secret}", "openai-agents-sdk.0.20.0"]
    return connect(f"{server.ws_url}/v1/realtime", subprotocols=protocols, origin=APP_ORIGIN, open_timeout=60)


def until(ws, event_type: str, limit: int = 400) -> dict:
    for _ in range(limit):
        event = json.loads(ws.recv(timeout=10))
        if event["type"] == event_type:
            return event
        assert event["type"] != "error", event
    raise AssertionError(f"no {event_type} within {limit} events")


def refused(ws) -> tuple[dict, int]:
    """The ``error`` event and the close code of a socket the server accepted only to say why."""
    error = None
    try:
        while True:
            event = json.loads(ws.recv(timeout=10))
            error = event["error"] if event["type"] == "error" else error
    except ConnectionClosed:
        pass
    return error, ws.close_code


def test_a_minted_secret_opens_one_scoped_session_from_a_page_of_another_origin(server):
    _, key = user_and_key("secret-owner")
    session = {"type": "realtime", "model": "echo", "instructions": "You are the museum guide."}
    session["duplex"] = {"record": False}
    status, minted = mint(server, key, {"expires_after": {"anchor": "created_at", "seconds": 45}, "session": session})
    assert status == 200, minted
    secret = minted["value"]
    assert re.fullmatch(r"ek_[A-Za-z0-9_-]{40,}", secret)
    assert abs(minted["expires_at"] - (time.time() + 45)) < 5
    assert minted["session"]["instructions"] == "You are the museum guide."
    assert minted["session"]["model"] == "echo" and minted["session"]["object"] == "realtime.session"
    assert ClientSecret.objects.get().secret_hash != secret  # only a hash is stored

    with browser_socket(server, secret) as ws:
        assert ws.subprotocol == "realtime"  # chromium fails a handshake that selects none of its offers
        created = until(ws, "session.created")["session"]
        assert created["instructions"] == "You are the museum guide."  # the secret's configuration, applied
        assert created["duplex"]["record"] is False and created["model"] == "echo"
        tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(1920 * 4) / 24000) * 32767).astype("<i2")
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": _b64(tone.tobytes())}))
        assert until(ws, "response.output_audio.delta")["delta"]

        # The same secret again (say, a copy that leaked from the page): spent.
        with browser_socket(server, secret) as again:
            error, code = refused(again)
        assert (error["code"], code) == ("forbidden", 4401)
        assert "client secret" in error["message"]
    assert ClientSecret.objects.get().used_at is not None


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def test_the_client_cannot_widen_what_the_secret_fixed(server):
    _, key = user_and_key("scoped")
    granted = {"instructions": "Only talk about trains.", "duplex": {"record": False}}
    secret = mint(server, key, {"session": granted})[1]["value"]
    with connect(
        f"{server.ws_url}/v1/realtime?model=echo",
        additional_headers={"Authorization": f"Bearer {secret}"},
        open_timeout=60,
    ) as ws:  # Bearer works too (a server-side client), and needs no Origin
        until(ws, "session.created")
        for widened, param in (
            ({"instructions": "Talk about anything."}, "session.instructions"),
            ({"duplex": {"record": True}}, "session.duplex.record"),
        ):
            ws.send(json.dumps({"type": "session.update", "event_id": "widen", "session": widened}))
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] == "error", event
            assert (event["error"]["code"], event["error"]["param"]) == ("client_secret_scope", param)
        # Repeating the fixed fields (stock SDKs resend their whole session) and choosing a format is fine.
        same = {
            "instructions": "Only talk about trains.",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}},
        }
        ws.send(json.dumps({"type": "session.update", "session": same}))
        updated = until(ws, "session.updated")["session"]
        assert updated["instructions"] == "Only talk about trains." and updated["duplex"]["record"] is False
        assert updated["audio"]["input"]["format"]["rate"] == 16000


def test_lifetime_is_configurable_and_an_expired_secret_opens_nothing(server):
    _, key = user_and_key("ttl")
    status, minted = mint(server, key, {"session": {"model": "echo"}})
    assert status == 200 and abs(minted["expires_at"] - (time.time() + TTL_S)) < 5  # the server's default
    status, body = mint(server, key, {"expires_after": {"anchor": "created_at", "seconds": MAX_TTL_S + 1}})
    assert (status, body["error"]["code"], body["error"]["param"]) == (400, "invalid_value", "expires_after.seconds")
    status, body = mint(server, key, {"expires_after": {"seconds": 5}})  # OpenAI's floor is 10 s
    assert (status, body["error"]["code"]) == (400, "invalid_value")

    ClientSecret.objects.filter(api_key__user__username="ttl").update(expires_at=timezone.now() - timedelta(seconds=1))
    with browser_socket(server, minted["value"]) as ws:
        error, code = refused(ws)
    assert (error["code"], code) == ("forbidden", 4401)


def revoke_in_the_web_ui(server, username: str, key_id: int) -> None:
    """Sign in and press *Revoke*: the server process saves the key, and its signal reaches the live socket."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

    def post(path: str, fields: dict) -> None:
        token = next(c.value for c in jar if c.name == "csrftoken")
        data = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(server.url + path, data=data, headers={"Referer": server.url + path})
        opener.open(request, timeout=10).read()

    opener.open(f"{server.url}/accounts/login/", timeout=10).read()
    post("/accounts/login/", {"username": username, "password": PASSWORD})
    post(f"/accounts/keys/{key_id}/revoke/", {})


def test_revoking_the_key_ends_the_secrets_session_and_kills_its_unused_secrets(server):
    user, key = user_and_key("revoker")
    live_secret = mint(server, key, {"session": {"model": "echo"}})[1]["value"]
    unused_secret = mint(server, key, {"session": {"model": "echo"}})[1]["value"]
    with browser_socket(server, live_secret) as ws:
        until(ws, "session.created")
        revoke_in_the_web_ui(server, "revoker", ApiKey.objects.get(user=user).pk)
        assert until(ws, "session.closed")["reason"] == "credentials_revoked"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert ws.close_code == 4401
    with browser_socket(server, unused_secret) as ws:
        error, code = refused(ws)
    assert (error["code"], code) == ("forbidden", 4401)
    assert mint(server, key, {})[0] == 401  # and the key mints no more


def test_mint_refusals_are_typed(server):
    user, key = user_and_key("refusals")
    assert mint(server, None, {})[1]["error"]["code"] == "invalid_api_key"
    assert mint(server, "pk_wrong", {})[0] == 401
    secret = mint(server, key, {})[1]["value"]
    assert mint(server, secret, {})[0] == 401  # a secret mints nothing: only an API key does
    assert mint(server, key, b"{not json")[1]["error"]["code"] == "invalid_json"
    assert mint(server, key, [1, 2])[1]["error"]["code"] == "invalid_json"
    status, body = mint(server, key, {"session": {"type": "transcription"}})
    assert (status, body["error"]["code"]) == (400, "invalid_value")
    status, body = mint(server, key, {"session": {"duplex": {"persona_id": 987654}}})
    assert (status, body["error"]["code"]) == (404, "persona_not_found")
    status, body = mint(server, key, {"session": {"audio": {"output": {"voice": "no-such-voice"}}}})
    assert (status, body["error"]["code"]) == (404, "voice_not_found")
    assert mint(server, key, method="GET")[0] == 405
    assert ClientSecret.objects.filter(api_key__user=user).count() == 1  # refused requests minted nothing
