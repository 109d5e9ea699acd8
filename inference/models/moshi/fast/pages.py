"""Host bookkeeping of the paged KV: which physical page each slot's ring is made of, grown as the call grows.

A slot's ring of ``window`` positions (``LMConfig.kv_window``) is cut into ``pages_per_slot`` logical pages of
``page_size`` positions; logical page j holds ring positions ``j * page_size ..``. A slot is given a physical
page only when its context first reaches that page, and gives them all back when its session ends, so a
two-minute call holds half of what a full 3000-frame (4-minute) context needs. Physical page 0 is the trash page:
unassigned table entries and the scratch slot point there (padding rows write into it; nothing reads it as
valid, because a row reads only the first ``min(passes, window)`` positions of its own ring).

When the pool runs dry, a live call is never dropped: the slot that needs a page keeps the pages it has and
its ring *shrinks* to them (``windows[slot]``), so from then on it attends over a shorter context, oldest
frames overwritten first, like a model with a smaller window. Admission (``admissible``), which counts the
memory calls are expected to hold over their remaining life, keeps that rare.

Contiguous rings are the special case ``page_size == window``: one page per slot, given at its first pass.
Nothing here touches the device; ``SlotKV`` copies the changes into its page table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TRASH_PAGE = 0
ADMIT_Z = 3.0  # admission's margin, in standard deviations of the expected pages in use
ADMIT_STEPS = 24  # admission looks ahead over one window in this many steps (10 s each for a 4-minute window)


@dataclass(frozen=True)
class PageChange:
    """Logical page ``index`` of ``slot`` now maps to physical ``page`` (``TRASH_PAGE`` when given back)."""

    slot: int
    index: int
    page: int


@dataclass
class PagePool:
    """Free physical pages and each slot's held pages.

    Args:
        num_pages: physical pages including the trash page.
        page_size: ring positions per page.
        window: the model's ring length (every slot's ring until it is capped).
        num_slots: slots that can hold pages (the scratch slot holds none).
    """

    num_pages: int
    page_size: int
    window: int
    num_slots: int
    free: list[int] = field(init=False)
    held: list[list[int]] = field(init=False)
    windows: list[int] = field(init=False)
    capped_slots: int = field(init=False, default=0)  # sessions whose ring shrank since start (a counter)

    def __post_init__(self) -> None:
        if self.page_size < 1 or self.window < 1:
            raise ValueError(f"page_size and window must be >= 1, got {self.page_size}, {self.window}")
        if self.num_pages < 2:
            raise ValueError(f"a pool needs the trash page and at least one more, got {self.num_pages}")
        self.free = list(range(self.num_pages - 1, TRASH_PAGE, -1))  # pop() hands out the lowest first
        self.held = [[] for _ in range(self.num_slots)]
        self.windows = [self.window] * self.num_slots

    @property
    def pages_per_slot(self) -> int:
        return -(-self.window // self.page_size)

    @property
    def free_pages(self) -> int:
        return len(self.free)

    @property
    def usable_pages(self) -> int:
        return self.num_pages - 1

    def pages_for(self, positions: int) -> int:
        """Pages a ring of ``positions`` filled positions spans (at most a full window)."""
        return -(-min(max(positions, 0), self.window) // self.page_size)

    def grow(self, slot: int, positions: int) -> list[PageChange]:
        """Make ``slot`` hold the pages its first ``positions`` ring positions need (a pass writes position
        ``passes``, so before it ``positions = passes + 1``). Shrinks the slot's ring when the pool is dry."""
        held = self.held[slot]
        needed = self.pages_for(min(positions, self.windows[slot]))
        changes = []
        while len(held) < needed:
            if not self.free:  # never drop the call: its ring becomes the pages it has
                self.windows[slot] = len(held) * self.page_size
                self.capped_slots += 1
                break
            page = self.free.pop()
            changes.append(PageChange(slot, len(held), page))
            held.append(page)
        return changes

    def release(self, slot: int) -> list[PageChange]:
        """Give back every page of ``slot`` and restore its full window."""
        held = self.held[slot]
        changes = [PageChange(slot, index, TRASH_PAGE) for index in range(len(held))]
        self.free.extend(reversed(held))
        self.held[slot] = []
        self.windows[slot] = self.window
        return changes

    def admissible(
        self,
        live: list[tuple[int, int]],
        mean_call_positions: float,
        new_positions: int = 0,
        z: float = ADMIT_Z,
    ) -> int:
        """How many more sessions fit, by the memory the calls are expected to hold over their remaining life.

        Call lengths are taken as exponential with mean ``mean_call_positions`` (so a call of any age has that
        much still to go on average). At each future moment t (in 24 steps up to a full window) a live session at
        p positions is still there with probability ``exp(-t / mean)`` and then holds the pages of
        ``min(p + t, window)``; the expected pages of all live sessions plus k new ones, plus ``z`` standard
        deviations of that sum, must stay within the pool at every t, and the new ones' first pages must be free
        now. Counting only what calls hold now would let fresh calls (one page each) in until their growth
        overran the pool; counting every call at its full window is the contiguous capacity. Measured on the
        H200 (bench/notes/lockstep-gpu.md): with a 2 sd margin the pool still ran dry after about 80 s at ~250
        calls, hence 3.

        Args:
            live: (slot, filled ring positions) of every live session.
            mean_call_positions: the expected call length, in positions (frames).
            new_positions: positions a new session starts with (a restored context; 0 for a fresh call).
            z: the margin in standard deviations of the expected total (shrunk rings become rare, not impossible).
        """
        t = np.linspace(0.0, self.window, ADMIT_STEPS + 1)[:, None]  # [T, 1]
        alive = np.exp(-t / max(mean_call_positions, 1.0))
        positions = np.array([p for _, p in live], dtype=np.float64).reshape(1, -1)
        # a call whose ring shrank counts at its full window: its shortfall is memory owed, and admitting on
        # the pages it gave up would shrink more calls
        held = np.ceil(np.minimum(positions + t, self.window) / self.page_size)  # [T, N] pages if still there
        mean = (alive * held).sum(axis=1)
        var = (alive * (1.0 - alive) * held**2).sum(axis=1)
        new_mean = alive[:, 0] * np.ceil(np.minimum(new_positions + t[:, 0], self.window) / self.page_size)
        room = self.usable_pages - mean - z * np.sqrt(var)
        later = new_mean > 0
        fits = np.floor(room[later] / new_mean[later]).min() if later.any() else np.inf
        first = max(self.pages_for(new_positions + 1), 1)
        return int(max(min(fits, self.free_pages // first), 0))


# ---- what admission holds at a call-length mix --------------------------------------------------------------
# The engine reports this as its capacity (``FastBackend.capacity``) and ``python -m inference doctor`` estimates
# it from a card's memory: both call ``mix_population`` on their pool's pages, so the two cannot drift apart.


def steady_state_positions(count: int, mean_call_frames: float, cap_frames: float) -> list[int]:
    """Context positions of ``count`` live calls at the mix's steady state (evenly spaced quantiles).

    Calls of capped exponential length (mean ``mean_call_frames``, at most ``cap_frames``) are alive at age a
    with probability exp(-a / mean) (a < cap), so the ages of the calls in progress have that density, truncated
    at the cap.
    """
    if count <= 0:
        return []
    u = (np.arange(count) + 0.5) / count
    tail = 1.0 - np.exp(-cap_frames / mean_call_frames)
    return [int(a) for a in -mean_call_frames * np.log1p(-u * tail)]


def mix_population(
    pool_pages: int, page_size: int, window: int, mean_call_frames: float, cap_frames: float, *, limit: int
) -> int:
    """Live calls at which ``PagePool.admissible`` stops admitting, for calls at the mix's steady-state ages
    (at most ``limit``, the slots). Over a long run the population the engine holds averages this (it swings
    about +-15 % around it: ``tests/inference/checkpoints/test_capacity.py`` replays the H200 run)."""

    def admits_one_more(count: int) -> bool:
        pages = PagePool(num_pages=pool_pages + 1, page_size=page_size, window=window, num_slots=max(count, 1))
        live = []
        for slot, position in enumerate(steady_state_positions(count, mean_call_frames, cap_frames)):
            pages.grow(slot, position + 1)
            live.append((slot, position))
        if pages.capped_slots:
            return False
        return pages.admissible(live, mean_call_frames) >= 1

    if pool_pages < 1 or not admits_one_more(0):
        return 0
    low, high = 0, limit  # admits_one_more(low) holds; find the first count that does not
    if admits_one_more(high):
        return limit
    while high - low > 1:
        mid = (low + high) // 2
        if admits_one_more(mid):
            low = mid
        else:
            high = mid
    return high
