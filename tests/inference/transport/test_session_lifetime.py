"""A session lives as long as its call, not longer: through the socket transport, a call the caller closed
leaves nothing of its session in the service (each holds ~1 MB of rings and buffers; a busy service ends a
call every second or so).

The service and its socket server run in this process, so that the session objects themselves can be watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import secrets
import shutil
import tempfile
import weakref

import pytest

from inference.config import InferenceConfig
from inference.contracts import Closed, Ready, SessionRequest, TurnDetection
from inference.engines.echo import EchoEngine
from inference.service import InferenceService
from inference.transport.client import RemoteSessionHandle
from inference.transport.server import serve
from tests.inference.event_helpers import EventReader, send_frames


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
    stop.set()
    await server
    shutil.rmtree(folder, ignore_errors=True)


async def call_and_close(service: InferenceService, address: str, user: str, mode: str | None = None) -> weakref.ref:
    handle = await RemoteSessionHandle.open(address, SessionRequest(user_key=user))
    reader = EventReader(handle)
    assert isinstance(await reader.next(), Ready)
    if mode is not None:
        await handle.set_mode(mode=mode, turn_detection=TurnDetection() if mode == "half_duplex" else None)
    session = weakref.ref(service.sessions[user])
    if mode != "chat":  # a chat session takes audio inside its conversation items only
        await send_frames(handle, range(6))
    await handle.close()
    await reader.until(Closed)
    return session


async def test_a_closed_call_leaves_nothing_of_its_session(served):
    service, address = served
    sessions = [await call_and_close(service, address, f"caller-{i}") for i in range(3)]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2.0  # the connections end a moment after the close: well inside the 30 s grace
    while any(s() is not None for s in sessions) and loop.time() < deadline:
        await asyncio.sleep(0.05)
        gc.collect()
    assert service.sessions == {}
    assert [s() for s in sessions] == [None, None, None]  # not held 30 s by a grace timer the socket's end started


@pytest.mark.parametrize("mode", [None, "half_duplex", "chat"])
async def test_a_closed_call_is_freed_without_the_cycle_collector(served, mode):
    """No reference cycle holds a session: the interpreter's full collection runs a minute or more apart on a
    busy service, and every ended call's megabyte waited for it (the GPU soak's RSS rose with each call ended)."""
    service, address = served
    gc.collect()
    gc.disable()
    try:
        session = await call_and_close(service, address, "caller", mode)
        freed = asyncio.Event()
        if session() is not None:
            weakref.finalize(session(), freed.set)
            with contextlib.suppress(TimeoutError):  # the connection ends a moment after the close
                await asyncio.wait_for(freed.wait(), 2.0)
        held_by = [type(r).__qualname__ for r in gc.get_referrers(session())] if session() is not None else []
        assert session() is None, f"the closed session is still held, by {held_by}"
    finally:
        gc.enable()


async def test_a_dropped_connection_still_keeps_its_session_for_the_grace(served):
    """The other order, a socket that ends without a close: the session waits paused for its caller."""
    service, address = served
    handle = await RemoteSessionHandle.open(address, SessionRequest(user_key="dropped"))
    assert isinstance(await EventReader(handle).next(), Ready)
    await handle.detach()
    await asyncio.sleep(0.3)
    assert service.sessions["dropped"].state != "closed" and service.sessions["dropped"].attachment is None
