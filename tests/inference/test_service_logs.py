"""The inference service in production mode (``PARLEY_LOG_JSON=1``) logs JSON lines whose keys include the
``extra={...}`` fields of the call that logged: a real session's close carries its session_id and reason."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile

import pytest

from inference import api
from inference.contracts import Closed, Ready, SessionRequest
from tests.inference.event_helpers import EventReader
from tests.inference_service_process import start_inference_service


async def test_a_production_log_line_carries_session_id_and_reason_as_json_fields():
    tmp = tempfile.mkdtemp(prefix="parley-", dir="/tmp")  # unix socket paths must stay short
    path = os.path.join(tmp, "inference.sock")
    with pytest.MonkeyPatch.context() as patch:
        token = secrets.token_urlsafe(24)
        patch.setenv("PARLEY_INFERENCE_TOKEN", token)
        proc, _ = start_inference_service(path, PARLEY_ENGINE="echo", PARLEY_SLOTS="1", PARLEY_LOG_JSON="1")
        try:
            await api.start(inference_url=f"unix://{path}")
            handle = await api.open_session(SessionRequest(user_key="logs", persona="kind"))
            reader = EventReader(handle)
            ready = await reader.next()
            assert isinstance(ready, Ready)
            await handle.close()
            assert await reader.until(Closed) == Closed("client_close")
        finally:
            await api.shutdown()
            proc.terminate()
            rest = proc.stdout.read()
            proc.wait(10)
            shutil.rmtree(tmp, ignore_errors=True)
    records = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    closed = [r for r in records if r.get("message") == "session.closed"]
    assert closed, rest[-2000:]
    assert closed[0]["session_id"] == ready.session_id and closed[0]["reason"] == "client_close"
    assert closed[0]["name"] == "inference.session.dialogue" and closed[0]["levelname"] == "INFO"
