"""The realtime consumer's message loop: one await per client message, not a task and a wait.

Channels' ``await_many_dispatch`` races the client's queue and the channel layer with ``asyncio.wait`` and
makes a new task for every message it takes. A caller sends 12.5 audio frames and two acks a second, so at
a few hundred callers that task-and-wait became a tenth of a web process's CPU (bench/notes/serving-e2e.md,
the daphne loop's profile). Here the client's messages are awaited directly; the channel layer, which
brings only rare messages (a revoked key), is read by a task of its own that lives as long as the socket.
Dispatches stay one at a time, as channels promises: both readers dispatch under one lock, which an
unheld acquire takes without suspending.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]
Dispatch = Callable[[dict[str, Any]], Awaitable[None]]


async def dispatch_until_stopped(receive: Receive, layer_receive: Receive | None, dispatch: Dispatch) -> None:
    """Dispatch client messages (and the channel layer's, when there is one) until ``dispatch`` raises.

    ``StopConsumer`` (the socket closed) or any other exception ends the loop and propagates, whichever
    reader's dispatch raised it; the layer reader is cancelled on the way out.
    """
    one_at_a_time = asyncio.Lock()
    client_loop = asyncio.current_task()
    layer_failure: list[BaseException] = []

    async def from_layer() -> None:
        assert layer_receive is not None
        try:
            while True:
                message = await layer_receive()
                async with one_at_a_time:
                    await dispatch(message)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the client loop, which re-raises it
            layer_failure.append(exc)
            if client_loop is not None:
                client_loop.cancel()

    layer_reader = asyncio.create_task(from_layer()) if layer_receive is not None else None
    try:
        while True:
            message = await receive()
            async with one_at_a_time:
                await dispatch(message)
            # A bare yield (no task, no wait): with messages already queued, ``receive`` returns without
            # suspending, and the socket's other tasks (the session pump that sends session.created and the
            # agent's audio) would wait behind a whole backlog of client frames.
            await asyncio.sleep(0)
    except asyncio.CancelledError:
        if layer_failure:
            raise layer_failure[0] from None
        raise
    finally:
        if layer_reader is not None:
            layer_reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await layer_reader
