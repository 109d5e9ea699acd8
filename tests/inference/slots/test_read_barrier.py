"""The tick's read barrier (``inference.slots.read_barrier``): before a tick takes its inputs, what reached a busy
loop's sockets before the tick has been read, and a loop that does not answer holds the tick no longer than the
bound."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import numpy as np

from inference.engines.base import SlotConfig
from inference.engines.echo import EchoEngine
from inference.slots.read_barrier import ReadBarrier
from inference.slots.worker import EngineWorker
from tests.inference.slots.test_worker import Recorder, chunk


@contextlib.contextmanager
def loop_in_thread():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def busy(seconds: float) -> None:
    time.sleep(seconds)  # a loop callback that holds the loop, as a burst of other callers' work does


def test_bytes_that_reached_a_busy_loop_before_the_barrier_are_read_when_it_returns():
    reader, writer = socket.socketpair()
    read: list[bytes] = []
    with loop_in_thread() as loop:

        def on_readable() -> None:
            time.sleep(0.02)  # a read that takes a while: the barrier must return after it, not beside it
            read.append(reader.recv(100))

        loop.call_soon_threadsafe(lambda: loop.add_reader(reader, on_readable))
        time.sleep(0.05)
        for round_ in range(5):
            loop.call_soon_threadsafe(busy, 0.05)
            time.sleep(0.01)  # the loop is in the busy callback now
            writer.send(b"frame %d" % round_)  # readable before the tick, not read: the loop is busy
            waited = ReadBarrier(1.0).wait([loop])
            assert read and read[-1] == b"frame %d" % round_, (round_, read)
            assert 0.02 < waited < 0.5
    reader.close()
    writer.close()


def test_a_loop_that_does_not_answer_holds_the_tick_no_longer_than_the_bound():
    barrier = ReadBarrier(0.02)
    with loop_in_thread() as loop:
        loop.call_soon_threadsafe(busy, 0.3)
        time.sleep(0.01)
        waited = barrier.wait([loop])
        assert 0.015 < waited < 0.1 and barrier.timeouts == 1
        time.sleep(0.35)  # the late marker of that tick comes back and counts for nothing
        assert barrier.wait([loop]) < 0.1 and barrier.timeouts == 1 and barrier.waits == 2
    closed = asyncio.new_event_loop()
    closed.close()
    assert ReadBarrier(1.0).wait([closed]) == 0.0, "a closed loop is not waited for"
    assert ReadBarrier(0.0).wait([closed]) == 0.0


async def test_a_frame_pushed_by_a_busy_loop_just_before_the_tick_makes_that_tick():
    """The worker's ticks wait for the loop of their slots: a frame the loop pushes late in a burst is heard."""
    heard_in_time = {wait_s: await frames_heard_in_their_tick(wait_s) for wait_s in (0.0, 0.04)}
    assert heard_in_time == {0.0: 0, 0.04: 6}


async def frames_heard_in_their_tick(wait_s: float, frames: int = 6) -> int:
    """Right after each tick's output the loop is held to just past the next tick's deadline, then pushes that
    tick's frame: how many of those frames the next tick echoed (the echo engine answers in the same tick)."""
    loop = asyncio.get_running_loop()
    worker = EngineWorker(EchoEngine(1, delay_frames=0), inbox_frames=4, read_wait_s=wait_s)
    listener = Recorder()
    outputs = listener.outputs
    worker.open(0, SlotConfig(), listener, loop)
    worker.start()
    try:
        await listener.wait_for(lambda: len(outputs) >= 3)
        hits = 0
        for k in range(frames):
            seen = len(outputs)
            await listener.wait_for(lambda seen=seen: len(outputs) > seen)
            hold_the_loop(worker.period_s + 0.005)
            worker.push(0, chunk(0.5 + k / 100))
            pushed = len(outputs)
            await listener.wait_for(lambda pushed=pushed: len(outputs) >= pushed + 2)
            first = outputs[pushed][0].audio
            hits += bool(first.size) and round(float(first[0]), 2) == round(0.5 + k / 100, 2)
        return hits
    finally:
        worker.stop()


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # on purpose in a coroutine: the loop is busy while the tick's deadline passes


def test_no_wait_means_no_marker():
    assert ReadBarrier(0.0).wait([]) == 0.0 and np.isfinite(ReadBarrier(0.01).wait([]))
