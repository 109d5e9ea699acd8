"""Host bookkeeping of the paged KV: which physical page each slot's ring is made of, grown as the call grows.

A slot's ring of ``window`` positions (``LMConfig.kv_window``) is cut into ``pages_per_slot`` logical pages of
``page_size`` positions; logical page j holds ring positions ``j * page_size ..``. A slot is given a physical
page only when its context first reaches that page, and gives them all back when its session ends, so a
two-minute call holds two fifths of what a full 3000-frame context needs. Physical page 0 is the trash page:
unassigned table entries and the scratch slot point there (padding rows write into it; nothing reads it as
valid, because a row reads only the first ``min(passes, window)`` positions of its own ring).

When the pool runs dry, a live call is never dropped: the slot that needs a page keeps the pages it has and
its ring *shrinks* to them (``windows[slot]``), so from then on it attends over a shorter context, oldest
frames overwritten first, like a model with a smaller window. Admission (``admissible``) keeps that rare.

Contiguous rings are the special case ``page_size == window``: one page per slot, given at its first pass.
Nothing here touches the device; ``SlotKV`` copies the changes into its page table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TRASH_PAGE = 0


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

    def admissible(self, live: list[tuple[int, int]], horizon_positions: int, new_positions: int = 0) -> int:
        """How many more sessions fit: every live session and the new ones can grow for ``horizon_positions``
        more positions with the pages free now, even if no call ends meanwhile.

        Args:
            live: (slot, filled ring positions) of every live session.
            horizon_positions: how far ahead growth is guaranteed; calls ending in that time free their pages,
                which is what lets more sessions in than full contexts fit.
            new_positions: positions a new session starts with (a restored context; 0 for a fresh call).
        """
        owed = 0
        for slot, positions in live:
            reach = min(positions + horizon_positions, self.windows[slot])
            owed += max(self.pages_for(reach) - len(self.held[slot]), 0)
        per_new = max(self.pages_for(new_positions + horizon_positions), 1)
        return max((self.free_pages - owed) // per_new, 0)
