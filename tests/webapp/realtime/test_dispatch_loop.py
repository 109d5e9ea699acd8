"""The consumer's message loop (webapp.conversations.dispatch_loop): both sources dispatched, one at a time,
and whatever a dispatch raises ends the loop with that exception."""

from __future__ import annotations

import asyncio

import pytest
from channels.exceptions import StopConsumer

from webapp.conversations.dispatch_loop import dispatch_until_stopped


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5))


def test_client_and_layer_messages_are_dispatched_one_at_a_time_until_stop():
    async def scenario():
        client: asyncio.Queue = asyncio.Queue()
        layer: asyncio.Queue = asyncio.Queue()
        seen, active = [], []

        async def dispatch(message):
            active.append(message["n"])
            assert len(active) == 1, f"two dispatches at once: {active}"
            await asyncio.sleep(0.001)  # a dispatch that suspends: the other reader must wait for it
            seen.append(message["n"])
            active.pop()
            if message["n"] == "stop":
                raise StopConsumer()

        for n in range(5):
            client.put_nowait({"n": f"c{n}"})
        layer.put_nowait({"n": "revoked"})

        async def stop_later():
            await asyncio.sleep(0.05)
            client.put_nowait({"n": "stop"})

        stopper = asyncio.create_task(stop_later())
        with pytest.raises(StopConsumer):
            await dispatch_until_stopped(client.get, layer.get, dispatch)
        await stopper
        return seen

    seen = run(scenario())
    assert [n for n in seen if n.startswith("c")] == ["c0", "c1", "c2", "c3", "c4"]  # client order kept
    assert "revoked" in seen and seen[-1] == "stop"


def test_an_exception_in_a_layer_dispatch_ends_the_loop_with_it():
    async def scenario():
        client: asyncio.Queue = asyncio.Queue()  # the client stays silent
        layer: asyncio.Queue = asyncio.Queue()
        layer.put_nowait({"n": "bad"})

        async def dispatch(message):
            raise ValueError(message["n"])

        await dispatch_until_stopped(client.get, layer.get, dispatch)

    with pytest.raises(ValueError, match="bad"):
        run(scenario())


def test_without_a_channel_layer_only_the_client_is_read():
    async def scenario():
        client: asyncio.Queue = asyncio.Queue()
        client.put_nowait({"n": 1})
        client.put_nowait({"n": 2})
        got = []

        async def dispatch(message):
            got.append(message["n"])
            if len(got) == 2:
                raise StopConsumer()

        with pytest.raises(StopConsumer):
            await dispatch_until_stopped(client.get, None, dispatch)
        return got

    assert run(scenario()) == [1, 2]


def test_the_sockets_other_tasks_run_between_queued_client_messages():
    """A backlog of client messages must not starve the session pump (it sends session.created)."""

    async def scenario():
        client: asyncio.Queue = asyncio.Queue()
        order = []
        for n in range(3):
            client.put_nowait({"n": n})

        async def pump():
            order.append("pump")

        async def dispatch(message):
            order.append(message["n"])
            if message["n"] == 2:
                raise StopConsumer()

        asyncio.get_running_loop().create_task(pump())
        with pytest.raises(StopConsumer):
            await dispatch_until_stopped(client.get, None, dispatch)
        return order

    assert run(scenario()).index("pump") < 2  # the pump ran before the last queued message was dispatched
