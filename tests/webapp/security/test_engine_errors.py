"""Finding 6 (engine load errors): the caller gets a generic reason; the server log has the detail."""

import json
import logging

import pytest
from django.test import AsyncClient

from inference import api
from tests.webapp.realtime.realtime_helpers import make_account, open_peer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def broken_engine(monkeypatch, tmp_path):
    """The configured checkpoint is missing: building the engine fails with the server's path in the message."""
    checkpoint = tmp_path / "srv-private-models" / "personaplex-7b"
    monkeypatch.setenv("PARLEY_ENGINE", "personaplex")
    monkeypatch.setenv("PARLEY_CHECKPOINT", str(checkpoint))
    await api.shutdown()  # the next call reads the environment again
    yield checkpoint
    await api.shutdown()


async def test_a_caller_gets_engine_failed_without_server_paths(broken_engine, caplog):
    account = await make_account("alice")
    with caplog.at_level(logging.ERROR):
        peer, connected, code = await open_peer(key=account.key)
        assert connected, code
        error = await peer.error(wait_s=120)  # the engine's module imports torch first: slow on a busy machine
        closed = await peer.until("closed")
    assert error["code"] == "engine_failed" and error["type"] == "server_error"
    assert closed["code"] == 4011
    seen = json.dumps(peer.seen)
    assert "srv-private-models" not in seen and "/tmp" not in seen and "checkpoint" not in seen.lower()
    assert str(broken_engine) in caplog.text  # the operator still learns what went wrong


async def test_the_call_page_says_unavailable_without_server_paths(broken_engine, caplog):
    account = await make_account("bob")
    client = AsyncClient()
    await client.aforce_login(account.user)
    with caplog.at_level(logging.ERROR):
        page = await client.get("/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "srv-private-models" not in html and "not available" in html
    assert str(broken_engine) in caplog.text
