"""Close codes as a real client gets them: a real daphne, a real WebSocket client (``websockets``).

A test communicator accepts any close code; daphne (autobahn) sends only 1000 and 3000-4999 and
answers any other with a traceback, the client then seeing 1006/1011. Each refusal the protocol
documents is checked here end to end: the ``error`` event that says why, then the documented code,
and nothing in daphne's log.
"""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.live_server import live_server_env, run_live_server
from webapp.accounts.services import apikey_create
from webapp.conversations.close_codes import CloseCode

pytestmark = pytest.mark.django_db(transaction=True)


def key_for(username: str) -> str:
    user = get_user_model().objects.create_user(username=username, password="pw-for-tests-only")
    return apikey_create(user=user, name="close codes")[1]


def refusal(ws_url: str, *, key: str | None, path: str = "/v1/realtime?model=echo") -> tuple[dict, int]:
    """Connect, read events until the server closes: (the ``error`` event, the close code)."""
    # Without a key, a browser's way in: the site's own Origin (and no cookie, so not authenticated).
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {"Origin": "http" + ws_url[2:]}
    error = None
    with connect(ws_url + path, additional_headers=headers, open_timeout=10) as ws:
        try:
            while True:
                event = json.loads(ws.recv(timeout=10))
                if event["type"] == "error":
                    error = event["error"]
        except ConnectionClosed:
            pass
        code = ws.close_code
    assert error is not None, f"closed with {code} without an error event"
    return error, code


@pytest.fixture
def tight_server(django_db_blocker):
    """One slot, no queue, two wrong keys a minute per address: each refusal is easy to reach."""
    env = live_server_env("echo", PARLEY_SLOTS="1", PARLEY_QUEUE_MAX="0")
    with override_settings(PARLEY_KEY_FAILURE_RATE="2/minute", PARLEY_RATE_LIMIT_STORAGE="async+memory://"):
        with run_live_server(django_db_blocker, env) as server:  # the child keeps the settings of the fork
            yield server


def test_every_refusal_reaches_a_real_client_with_its_documented_code(tight_server, capfd):
    alice, bob = key_for("alice-close"), key_for("bob-close")

    error, code = refusal(tight_server.ws_url, key=None)
    assert (error["code"], code) == ("forbidden", CloseCode.UNAUTHENTICATED) and code == 4401

    error, code = refusal(tight_server.ws_url, key=alice, path="/v1/realtime?model=no-such-engine")
    assert (error["code"], code) == ("model_not_found", CloseCode.POLICY) and code == 4008

    with connect(
        tight_server.ws_url + "/v1/realtime?model=echo", additional_headers={"Authorization": f"Bearer {alice}"}
    ) as first:
        while json.loads(first.recv(timeout=10))["type"] != "session.created":
            pass
        error, code = refusal(tight_server.ws_url, key=bob)  # the one slot is taken and there is no queue
        assert (error["code"], error["type"], code) == ("resource_exhausted", "rate_limit_error", 4013)
        assert code == CloseCode.QUEUE_FULL

    # The connect without credentials above was the address's first failed authentication; a wrong key the second.
    assert refusal(tight_server.ws_url, key="pk_wrong")[0]["code"] == "forbidden"
    error, code = refusal(tight_server.ws_url, key=bob)  # the right key, but from the guessing address
    assert (error["code"], error["type"], code) == ("rate_limit_exceeded", "rate_limit_error", 4429)
    assert code == CloseCode.RATE_LIMITED and "try again in" in error["message"]

    log = capfd.readouterr().err
    assert "invalid close code" not in log and "Traceback" not in log, log
