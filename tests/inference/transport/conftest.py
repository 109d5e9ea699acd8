"""The socket transport's tests: a service and its socket server in this process (``served``)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import shutil
import tempfile

import pytest

from inference.config import InferenceConfig
from inference.engines.echo import EchoEngine
from inference.service import InferenceService
from inference.transport.link import close_links
from inference.transport.server import serve


@pytest.fixture
async def served(monkeypatch):
    token = secrets.token_urlsafe(24)
    monkeypatch.setenv("PARLEY_INFERENCE_TOKEN", token)  # the client's side reads it from the environment
    config = InferenceConfig.from_env().with_overrides(engine="echo", slots=4, inference_token=token, record="off")
    # The echo engine, listing every mode (a half-duplex or chat session has collaborators of its own), at the
    # 16 kHz half-duplex's voice detector takes.
    engine = EchoEngine(4, rate=16_000)
    engine.capabilities = dataclasses.replace(engine.capabilities, modes=("duplex", "half_duplex", "chat"))
    service = InferenceService(config, engine)
    await service.start()
    folder = tempfile.mkdtemp(prefix="parley-", dir="/tmp")  # unix socket paths must stay short
    socket_path = os.path.join(folder, "inference.sock")
    stop = asyncio.Event()
    server = asyncio.create_task(serve(service, socket_path, stop))
    for _ in range(250):  # serve() makes the socket at once; 5 s at most
        if await asyncio.to_thread(os.path.exists, socket_path):
            break
        await asyncio.sleep(0.02)
    yield service, f"unix://{socket_path}"
    await close_links()  # this test's loop ends: its link to the service with it
    stop.set()
    await server
    shutil.rmtree(folder, ignore_errors=True)
