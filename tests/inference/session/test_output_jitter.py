"""The test-only output jitter: random delays, order kept, bursts, and an end to it."""

from __future__ import annotations

import asyncio

import pytest

from inference.session.output_jitter import OutputJitter


async def test_outputs_are_delayed_up_to_the_maximum_and_never_reordered():
    loop = asyncio.get_running_loop()
    jitter = OutputJitter(loop, max_ms=50, seed=3)
    sent_at, got = {}, []
    for i in range(40):
        sent_at[i] = loop.time()
        jitter.send(lambda i=i: got.append((i, loop.time())))
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.2)
    assert [i for i, _ in got] == list(range(40))  # order kept, nothing lost
    delays = [t - sent_at[i] for i, t in got]
    assert max(delays) <= 0.05 + 0.05  # its own delay, or waiting behind an earlier one, plus scheduling
    assert max(delays) > 0.02 and min(delays) < 0.02  # really random
    released = [t for _, t in got]
    assert any(b - a < 0.002 for a, b in zip(released, released[1:], strict=False))  # a burst after a long delay


async def test_jitter_stops_after_its_phase_and_output_goes_out_at_once():
    loop = asyncio.get_running_loop()
    jitter = OutputJitter(loop, max_ms=30, first_s=0.05, seed=1)
    got = []
    jitter.send(lambda: got.append("jittered"))
    assert got == []
    await asyncio.sleep(0.1)
    assert got == ["jittered"]
    jitter.send(lambda: got.append("direct"))
    assert got == ["jittered", "direct"]  # synchronous: the jitter phase is over and nothing is held


async def test_cancel_drops_what_is_held():
    loop = asyncio.get_running_loop()
    jitter = OutputJitter(loop, max_ms=30, seed=2)
    got = []
    for _ in range(5):
        jitter.send(lambda: got.append(1))
    jitter.cancel()
    await asyncio.sleep(0.06)
    assert got == []


async def test_settings_are_checked():
    with pytest.raises(ValueError):
        OutputJitter(asyncio.get_running_loop(), max_ms=0)
