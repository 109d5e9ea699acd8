"""The slot pool's second limit: an engine whose memory admits fewer sessions than it has free slots.

The worker publishes ``(count, slots open in the engine)`` after every tick and close; the pool admits while its
sessions whose slot is not open yet are fewer than ``count``, queues the rest, and lets them in on a later close
or on its periodic pass once memory frees up.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from inference.contracts import ParleyError
from inference.slots.pool import (
    PACE_ALONE_SHARE,
    PACE_MIN_SEEN,
    TIME_MIN_TICKS,
    TIME_WINDOW_TICKS,
    UNSEEN_MAX_S,
    UNSEEN_WINDOWS,
    SlotPool,
)
from inference.slots.timing import TimingRing


class Applicant:
    def __init__(self):
        self.slot: int | None = None
        self.positions: list[int] = []

    def admitted(self, slot: int) -> None:
        self.slot = slot

    def queue_position(self, position: int, queue_length: int, estimated_wait_s: float) -> None:
        self.positions.append(position)


class Worker:
    """What the pool uses of ``EngineWorker``: the slot count, the published admission, slot closes."""

    def __init__(self, slots: int):
        self.engine = SimpleNamespace(num_slots=slots)
        self.admission: tuple[int | None, frozenset[int]] = (None, frozenset())

    def publish(self, count: int | None, opened: set[int] = frozenset()) -> None:
        self.admission = (count, frozenset(opened))

    def close(self, slot, on_closed, loop) -> None:
        loop.call_soon(on_closed)


async def test_memory_limits_admission_below_the_free_slots_and_queued_callers_get_in_later():
    loop = asyncio.get_running_loop()
    worker = Worker(slots=4)
    pool = SlotPool(worker, queue_max=4, loop=loop)
    worker.publish(1)  # the engine's memory takes one more session
    first, second, third = Applicant(), Applicant(), Applicant()
    pool.request(first)
    pool.request(second)  # a free slot, but the first session's slot is not open yet: it has the memory
    assert first.slot == 0 and second.slot is None and second.positions == [1]
    worker.publish(1)  # ticks later the first caller has sent no audio yet: its slot is still not open
    pool._periodic()
    assert second.slot is None  # it will need that memory once it starts
    worker.publish(1, opened={0})  # the first call's slot is open and counted; still room for one...
    worker.publish(0, opened={0})  # ... until it grew: nothing spare
    pool.request(third)
    assert third.slot is None and third.positions == [2]
    worker.publish(2, opened={0})  # live calls reached their full context: memory for two more, without a close
    pool._periodic()
    assert (second.slot, third.slot) == (1, 2)
    pool.stop()


async def test_without_a_queue_a_memory_refusal_says_what_is_full():
    loop = asyncio.get_running_loop()
    worker = Worker(slots=4)
    pool = SlotPool(worker, queue_max=0, loop=loop)
    worker.publish(0)
    with pytest.raises(ParleyError, match="memory is taken by live calls") as refused:
        pool.request(Applicant())
    assert refused.value.code == "resource_exhausted"
    worker.publish(None)  # an engine that rations nothing: slots alone decide
    admitted = Applicant()
    pool.request(admitted)
    assert admitted.slot == 0


async def test_a_close_lets_the_head_of_the_queue_in_when_memory_allows():
    loop = asyncio.get_running_loop()
    worker = Worker(slots=2)
    pool = SlotPool(worker, queue_max=2, loop=loop)
    worker.publish(1)
    live, waiting = Applicant(), Applicant()
    pool.request(live)
    pool.request(waiting)
    assert waiting.slot is None
    worker.publish(0, opened={0})  # the live call holds the memory
    pool._periodic()
    assert waiting.slot is None
    worker.publish(1)  # the worker closed the live call and counted its memory back
    pool.release(live, live.slot)
    await asyncio.sleep(0)
    assert waiting.slot == 0
    pool.stop()


class TimedWorker(Worker):
    """A worker whose recent ticks the test sets: an 80 ms engine."""

    def __init__(self, slots: int):
        super().__init__(slots)
        self.period_s = 0.08
        self.tick_ms = TimingRing()

    def ticks_took(self, ms: float, count: int = TIME_WINDOW_TICKS) -> None:
        for _ in range(count):
            self.tick_ms.add(ms)


async def test_an_engine_over_its_tick_budget_queues_new_callers_until_it_keeps_time_again():
    clock = Clock(asyncio.get_running_loop())
    worker = TimedWorker(slots=4)
    pool = SlotPool(worker, queue_max=2, loop=clock, tick_budget=0.9)  # 72 ms of the 80 ms period
    first, second, third, fourth = Applicant(), Applicant(), Applicant(), Applicant()
    worker.ticks_took(40.0, count=5)
    pool.request(first)  # too few ticks yet to judge the engine's time: admitted
    assert first.slot == 0
    worker.ticks_took(82.6)  # a median over the budget: the engine is at its compute capacity
    pool.request(second)
    assert second.slot is None and second.positions == [1] and pool.time_limited
    worker.ticks_took(75.0, count=20)  # one slow window among fast ones would not do it; still over here
    pool._periodic()
    assert second.slot is None
    pool.request(third)
    with pytest.raises(ParleyError) as refused:  # the queue is full: the refusal names the compute limit
        pool.request(fourth)
    assert refused.value.code == "resource_exhausted" and "compute capacity" in refused.value.message
    worker.ticks_took(60.0)  # the engine keeps time again, with the first call in its ticks by now:
    clock.now += UNSEEN_MAX_S  # the queue gets in on the periodic passes,
    pool._periodic()
    assert (second.slot, third.slot) == (1, None) and not pool.time_limited
    clock.now += UNSEEN_MAX_S  # one at a time: few calls are in the ticks, and the tick is near the budget
    pool._periodic()
    assert third.slot == 2
    pool.stop()


async def test_one_slow_tick_does_not_stop_admission():
    loop = asyncio.get_running_loop()
    worker = TimedWorker(slots=3)
    pool = SlotPool(worker, queue_max=2, loop=loop, tick_budget=0.9)
    worker.ticks_took(30.0, count=TIME_WINDOW_TICKS - 2)
    worker.ticks_took(400.0, count=2)  # a collection, a prefill: the 90th percentile stays at 30 ms
    caller = Applicant()
    pool.request(caller)
    assert caller.slot == 0
    pool.stop()


async def test_a_tail_of_late_ticks_stops_admission_though_the_median_keeps_time():
    loop = asyncio.get_running_loop()
    worker = TimedWorker(slots=3)
    pool = SlotPool(worker, queue_max=2, loop=loop, tick_budget=0.9)
    worker.ticks_took(60.0, count=TIME_WINDOW_TICKS - 5)
    worker.ticks_took(90.0, count=5)  # a fifth of the ticks late: those frames would be lost
    caller = Applicant()
    pool.request(caller)
    assert caller.slot is None and pool.time_limited
    pool.stop()


class Clock:
    """The service's loop with a clock the test moves (the pool reads ``time()`` and schedules its pass)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.now = loop, 1000.0

    def time(self) -> float:
        return self.now

    def call_later(self, delay, callback, *args):
        return self.loop.call_later(delay, callback, *args)


async def test_callers_let_in_at_the_limit_are_paced_until_the_ticks_show_what_they_cost():
    clock = Clock(asyncio.get_running_loop())
    worker = TimedWorker(slots=64)
    pool = SlotPool(worker, queue_max=4, loop=clock, tick_budget=0.8)  # 64 ms of the 80 ms period
    worker.ticks_took(20.0)
    live = [Applicant() for _ in range(20)]
    for caller in live:  # too few sessions yet for a session's share to mean anything: the window alone decides
        pool.request(caller)
    assert all(c.slot is not None for c in live) and PACE_MIN_SEEN <= 20
    clock.now += UNSEEN_WINDOWS * TIME_WINDOW_TICKS * worker.period_s + 0.1  # the 20 are in the ticks now
    worker.ticks_took(40.0)
    # 40 ms over 20 sessions: 2 ms each; 24 ms left of the budget: 12 more, charged before the ticks show them
    burst = [Applicant() for _ in range(17)]
    for caller in burst[:16]:
        pool.request(caller)
    assert sum(c.slot is not None for c in burst) == 12 and pool.time_paced and not pool.time_limited
    assert [c.positions for c in burst[12:16]] == [[1], [2], [3], [4]]
    with pytest.raises(ParleyError, match="compute capacity") as refused:  # the queue is full
        pool.request(burst[16])
    assert refused.value.code == "resource_exhausted"
    with pytest.raises(ParleyError, match="compute capacity"):  # the service's check before it builds a session
        pool.refuse_if_full()
    clock.now += UNSEEN_WINDOWS * TIME_WINDOW_TICKS * worker.period_s + 0.1
    worker.ticks_took(50.0)  # the 12 cost what was charged: 32 sessions at 50 ms, 14 ms left: 8 more
    pool._periodic()
    assert all(c.slot is not None for c in burst[12:16]) and not pool.time_paced
    pool.stop()


class UnitWorker(TimedWorker):
    """A 1 s engine (the unit engine's period)."""

    def __init__(self, slots: int):
        super().__init__(slots)
        self.period_s = 1.0


async def test_an_engine_that_keeps_time_with_few_sessions_is_paced_near_its_budget():
    """The unit engine with its vocoder holds about 12 sessions in its 1 s unit: fewer than a session's share can
    be judged by. Its ramp went by the window alone, and 63 sessions got in before the ticks showed them."""
    clock = Clock(asyncio.get_running_loop())
    worker = UnitWorker(slots=64)
    pool = SlotPool(worker, queue_max=8, loop=clock, tick_budget=0.8)  # 800 ms of the 1 s unit
    worker.ticks_took(100.0)
    first = [Applicant() for _ in range(4)]
    for caller in first:  # well under the budget: the window alone decides
        pool.request(caller)
    assert all(c.slot is not None for c in first) and not pool.time_paced
    clock.now += UNSEEN_MAX_S + 0.1  # seen within seconds, not two windows of 25 s
    worker.ticks_took(650.0)  # near the budget with 4 seen (162 ms each): one more at a time
    assert 650.0 > PACE_ALONE_SHARE * 800
    more = [Applicant() for _ in range(3)]
    for caller in more:
        pool.request(caller)
    assert [c.slot is not None for c in more] == [True, False, False] and pool.time_paced
    assert [c.positions for c in more[1:]] == [[1], [2]]
    pool._periodic()  # the fifth is not in the ticks yet: nobody else
    assert more[1].slot is None
    clock.now += UNSEEN_MAX_S + 0.1
    worker.ticks_took(700.0)  # 5 seen at 140 ms each: one more at a time again
    pool._periodic()
    assert (more[1].slot is not None, more[2].slot is None) == (True, True)
    pool.stop()


async def test_a_slow_engine_is_judged_by_its_first_ticks_not_after_a_whole_window():
    """25 ticks of a 1 s engine are 25 s: a ramp from empty must not go unjudged that long."""
    clock = Clock(asyncio.get_running_loop())
    worker = UnitWorker(slots=8)
    pool = SlotPool(worker, queue_max=2, loop=clock, tick_budget=0.8)
    worker.ticks_took(900.0, count=TIME_MIN_TICKS - 1)
    early = Applicant()
    pool.request(early)  # four ticks say nothing yet
    assert early.slot is not None and not pool.time_limited
    worker.ticks_took(900.0, count=2)
    late = Applicant()
    pool.request(late)  # six ticks over the budget: at its compute capacity
    assert late.slot is None and pool.time_limited
    pool.stop()
