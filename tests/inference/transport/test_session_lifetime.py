"""A session lives as long as its call, not longer: through the socket transport, a call the caller closed
leaves nothing of its session in the service (each holds ~1 MB of rings and buffers; a busy service ends a
call every second or so).

The service and its socket server run in this process, so that the session objects themselves can be watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref

import pytest

from inference.contracts import Closed, Ready, SessionRequest, TurnDetection
from inference.service import InferenceService
from inference.transport.client import RemoteSessionHandle
from tests.inference.event_helpers import EventReader, send_frames


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
