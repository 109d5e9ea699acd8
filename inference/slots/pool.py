"""Slot admission for one engine: who holds which slot, and a bounded FIFO queue for the rest.

A session is admitted when three limits allow: a free slot, the engine's memory (``_memory_admits``) and its
time (``_time_admits``: the engine still ticks within its budget of the period). A slot becomes free only
when the worker confirms the engine cleaned it up; ``_slot_freed`` is the dispatch point that admits the head
of the queue, and a periodic pass lets waiting sessions in when memory or time frees up without a close.
Runs on the service's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Generic, Protocol, TypeVar

from inference.contracts import ParleyError
from inference.slots.worker import EngineWorker

logger = logging.getLogger(__name__)

QUEUE_NOTIFY_PERIOD_S = 3.0
TIME_WINDOW_TICKS = 25  # the ticks (2 s of a lockstep engine) whose 90th percentile the time budget is held against
# The 23rd of 25: the two slowest ticks (a collection, a new call's prefill) do not stop admission, a tail does.
# The median let the H200 admit until half its ticks took 72 ms, and then a quarter of one call's ticks came
# late (more than 80 ms) and the calls lost frames (bench/notes/serving-e2e.md, the 8-minute soak).
TIME_RANK = 22
TIME_MIN_TICKS = 5  # fewer ticks than this say nothing yet; from here on their 90th percentile is judged
# A session admitted this recently (in windows of TIME_WINDOW_TICKS) is not in the window's ticks yet, or only in a
# few of them: its prefill and first frames. Two windows cover both: 4 s at 80 ms. At most UNSEEN_MAX_S: two
# windows of a 1 s unit engine are 50 s, and a new session shows in its ticks within its first units.
UNSEEN_WINDOWS = 2
UNSEEN_MAX_S = 8.0
# Below this many sessions past that age the tick is mostly the engine's fixed cost, so a session's share of it
# overstates what one more would add; admission then goes by the window alone (a ramp from empty) while the window
# is under PACE_ALONE_SHARE of the budget. Past it the pace applies to the unseen beyond the first (with none seen
# yet: one unseen session at a time). Without that an engine whose budget holds fewer than PACE_MIN_SEEN sessions
# was never paced: the unit engine with its vocoder, 1 s ticks and room for about 12, let 63 in during a 30 s
# ramp (bench/notes/serving-e2e.md).
PACE_MIN_SEEN = 16
PACE_ALONE_SHARE = 0.75
DEFAULT_SESSION_S = 120.0  # wait estimate before any session has finished


class Applicant(Protocol):
    """A session as the pool sees it: told when it gets a slot, and its place while it waits."""

    def admitted(self, slot: int) -> None: ...
    def queue_position(self, position: int, queue_length: int, estimated_wait_s: float) -> None: ...


A = TypeVar("A", bound=Applicant)


class SlotPool(Generic[A]):
    """Slots of one engine plus the FIFO queue of sessions waiting for one.

    Args:
        worker: the engine worker that confirms slot cleanup.
        queue_max: how many sessions may wait; 0 disables queueing.
        loop: the service's event loop.
        tick_budget: the fraction of the engine's period its ticks may take before new sessions wait (0: no
            time limit). Measured on the H200: admitted by memory alone, 229 PersonaPlex callers ticked at a
            median of 82.6 ms against the 80 ms frame, so every call lost frames (bench/notes/serving-e2e.md).
    """

    def __init__(
        self, worker: EngineWorker, *, queue_max: int, loop: asyncio.AbstractEventLoop, tick_budget: float = 0.0
    ):
        self.worker = worker
        self.queue_max = queue_max
        self.loop = loop
        self.tick_budget = tick_budget
        self.time_limited = False  # the engine was over its tick budget at the last look (logged on change)
        self.time_paced = False  # within it, but the sessions just admitted would take the rest (see _time_admits)
        self.owners: list[A | None] = [None] * worker.engine.num_slots
        self.closing: set[int] = set()
        self.queue: deque[A] = deque()
        self._last_position: dict[int, int] = {}  # id(session) -> position last told
        self._notify_timer: asyncio.TimerHandle | None = None
        self._mean_session_s = DEFAULT_SESSION_S
        self._admitted_at: dict[int, float] = {}  # slot -> loop time its session got it (time admission's pacing)

    @property
    def num_slots(self) -> int:
        return len(self.owners)

    def free_slots(self) -> list[int]:
        return [i for i, owner in enumerate(self.owners) if owner is None and i not in self.closing]

    def request(self, session: A) -> None:
        """Admit ``session`` to a free slot, or queue it; raise resource_exhausted when the queue is full."""
        free = self.free_slots()
        if free and self._admits_now():
            self._assign(free[0], session)
            return
        self._raise_if_full(free)
        self.queue.append(session)
        self._notify_positions(force_ids={id(session)})

    def refuse_if_full(self) -> None:
        """Raise what ``request`` would raise now, so that a refusal costs the service no session built for it
        (at the limit, refused callers retry by the dozen every second)."""
        free = self.free_slots()
        if not (free and self._admits_now()):
            self._raise_if_full(free)

    def _admits_now(self) -> bool:
        return not self.queue and self._memory_admits() and self._time_admits()

    def _raise_if_full(self, free: list[int]) -> None:
        if len(self.queue) < self.queue_max:
            return
        detail = "queueing is disabled" if self.queue_max == 0 else f"the queue is full ({self.queue_max} waiting)"
        if not free:
            busy = f"all {self.num_slots} slots are busy"
        elif self.time_limited or self.time_paced:
            busy = "the engine is at its compute capacity (one more call would make every call late)"
        else:
            busy = "the model's memory is taken by live calls"
        raise ParleyError(
            f"{busy} and {detail}; try again later", code="resource_exhausted", error_type="rate_limit_error"
        )

    def tell_position(self, session: A) -> None:
        """Re-send the current position to ``session`` (e.g. a new connection took it over)."""
        if session in self.queue:
            self._notify_positions(force_ids={id(session)})

    def release(self, session: A, slot: int | None, held_s: float = 0.0) -> None:
        """``session`` is done: leave the queue, or close its slot in the engine and free it when confirmed."""
        if session in self.queue:
            self.queue.remove(session)
            self._last_position.pop(id(session), None)
            self._notify_positions()
            return
        if slot is None or self.owners[slot] is not session:
            return
        if held_s > 0:
            self._mean_session_s = 0.8 * self._mean_session_s + 0.2 * held_s
        self.closing.add(slot)
        self.owners[slot] = None
        self._admitted_at.pop(slot, None)
        self.worker.close(slot, lambda: self._slot_freed(slot), self.loop)

    def estimated_wait_s(self, position: int) -> float:
        """A rough wait: sessions ahead (including this one), times the mean session length, per slot."""
        return round(position * self._mean_session_s / self.num_slots, 1)

    def stop(self) -> None:
        if self._notify_timer is not None:
            self._notify_timer.cancel()
            self._notify_timer = None

    # ---- internals ---------------------------------------------------------------------------

    def _slot_freed(self, slot: int) -> None:
        """The single dispatch point: the engine confirmed cleanup, so the head of the queue gets the slot."""
        self.closing.discard(slot)
        self._admit_queued()
        self._notify_positions()

    def _admit_queued(self) -> None:
        free = self.free_slots()
        while free and self.queue and self._memory_admits() and self._time_admits():
            session = self.queue.popleft()
            self._last_position.pop(id(session), None)
            self._assign(free.pop(0), session)

    def _memory_admits(self) -> bool:
        """Whether the engine's memory takes one more session.

        The worker publishes the engine's count with the slots open in the engine after every tick and close
        (``EngineWorker.admission``). Sessions admitted here whose slot is not open there yet (just admitted,
        or waiting for their first audio) hold no memory in that count but will, so they use it up first.
        """
        count, opened = self.worker.admission
        if count is None:
            return True
        pending = sum(1 for slot, owner in enumerate(self.owners) if owner is not None and slot not in opened)
        return pending < count

    def _time_admits(self) -> bool:
        """Whether the engine keeps time with the calls it has and with those just let in.

        The window: the 90th percentile of its last ticks within the budget. 2 s of ticks, not the last one: one
        slow tick (a collection, a new call's prefill) must not stop admission, a steady tail over the budget must.

        The pace: a session admitted now shows in those ticks only seconds later, so while it is unseen the
        window would let in every caller who asks. With 40 callers retrying each second at the limit the H200
        let them all in at once, the ticks ran late for whole stretches, and live calls lost frames
        (bench/notes/serving-e2e.md). So the sessions admitted within ``UNSEEN_WINDOWS`` windows are charged
        what a seen session costs on average (the tail over the seen sessions: more than the marginal cost,
        since the tail holds the engine's fixed cost too), and one more is let in only if the window's tail
        plus those charges stays within the budget. The queue's periodic pass lets the next one in once the
        engine has shown what the last ones cost. While fewer than ``PACE_MIN_SEEN`` sessions are seen the pace
        applies only past ``PACE_ALONE_SHARE`` of the budget, and to the unseen beyond the first.
        """
        if self.tick_budget <= 0:
            return True
        tail = _tail_ms(self.worker.tick_ms.recent(TIME_WINDOW_TICKS))
        budget_ms = self.tick_budget * self.worker.period_s * 1000.0
        over = tail > budget_ms
        if over != self.time_limited:
            self.time_limited = over
            log = logger.warning if over else logger.info
            log(
                "admission.time_limited" if over else "admission.time_ok",
                extra={"tick_ms_p90": tail},
            )
        if over:
            self.time_paced = False
            return False
        unseen_after = self.loop.time() - min(UNSEEN_WINDOWS * TIME_WINDOW_TICKS * self.worker.period_s, UNSEEN_MAX_S)
        unseen = sum(1 for at in self._admitted_at.values() if at > unseen_after)
        seen = len(self._admitted_at) - unseen
        if seen >= PACE_MIN_SEEN:
            self.time_paced = tail + (unseen + 1) * tail / seen > budget_ms
        elif tail > PACE_ALONE_SHARE * budget_ms:  # a few seen: their share overstates one more, so one always may
            self.time_paced = unseen > 0 and (not seen or tail + (unseen + 1) * tail / seen > budget_ms)
        else:
            self.time_paced = False
        return not self.time_paced

    def _assign(self, slot: int, session: A) -> None:
        self.owners[slot] = session
        self._admitted_at[slot] = self.loop.time()
        session.admitted(slot)

    def _notify_positions(self, force_ids: set[int] | None = None) -> None:
        """Tell queued sessions their position when it changed (or when forced)."""
        force_ids = force_ids or set()
        length = len(self.queue)
        for position, session in enumerate(self.queue, start=1):
            if id(session) in force_ids or self._last_position.get(id(session)) != position:
                self._last_position[id(session)] = position
                session.queue_position(position, length, self.estimated_wait_s(position))
        self._schedule_periodic()

    def _schedule_periodic(self) -> None:
        if self.queue and self._notify_timer is None:
            self._notify_timer = self.loop.call_later(QUEUE_NOTIFY_PERIOD_S, self._periodic)

    def _periodic(self) -> None:
        """At least every 3 s every queued session hears its position again (and memory or time that freed up
        without a call ending lets the head of the queue in)."""
        self._notify_timer = None
        self._admit_queued()
        if self.queue:
            self._notify_positions(force_ids={id(s) for s in self.queue})


def _tail_ms(recent: tuple[float, ...]) -> float:
    """The window's 90th percentile (the 23rd of 25 ticks; of fewer, the same share), 0 while too few to say."""
    if len(recent) < TIME_MIN_TICKS:
        return 0.0
    return sorted(recent)[(len(recent) * (TIME_RANK + 1)) // TIME_WINDOW_TICKS - 1]
