"""Paged KV of the fast path: the page bookkeeping, paged == contiguous token for token, a dry pool, admission.

The tiny PersonaPlex checkpoint has a 299-frame window, so pages of 16 frames give each slot 19 pages and a
run of 360 passes wraps every ring; the torch twins of the kernels run here (the Triton kernels' own paged
reads are checked against these twins in ``test_kernels_interpreted``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inference.engines.base import EngineError, SlotConfig, SlotInput
from inference.engines.lockstep import LockstepEngine
from inference.engines.lockstep_fast_backend import ADMISSIBLE_REFRESH_PASSES, KVPaging
from inference.engines.prefill_cache import restore_slot, snapshot_slot
from inference.models.moshi.fast.kv import SlotKV
from inference.models.moshi.fast.model import FastLM
from inference.models.moshi.fast.pages import TRASH_PAGE, PagePool
from inference.models.moshi.fast.session import live_forced
from inference.models.moshi.fast.step import FastLockstep
from inference.models.moshi.personaplex import FRAME_SAMPLES
from tests.inference.models.moshi_fast.tiny_pack import DATA, GREEDY


def _run(ls: FastLockstep, info, codes: torch.Tensor, slots: list[int]) -> list[torch.Tensor]:
    """Greedy passes of ``slots`` together over ``codes`` [T, n, 8]; the tokens of every pass."""
    out = []
    for t in range(codes.shape[0]):
        tokens, _ = ls.step_eager(torch.tensor(slots), *live_forced(info.lm, codes[t]))
        out.append(tokens.clone())
    return out


# ---- the bookkeeping ----------------------------------------------------------------------------------


def test_pages_are_given_as_the_context_grows_and_all_come_back():
    pool = PagePool(num_pages=1 + 10, page_size=16, window=40, num_slots=3)
    assert pool.pages_per_slot == 3 and pool.free_pages == 10
    assert [c.index for c in pool.grow(0, 1)] == [0]
    assert pool.grow(0, 16) == []  # still inside its first page
    assert [(c.index, c.page) for c in pool.grow(0, 17)] == [(1, 2)]
    assert len(pool.grow(1, 40)) == 3 and len(pool.grow(1, 500)) == 0  # a wrapped ring needs no more
    assert pool.free_pages == 10 - 5 and TRASH_PAGE not in pool.held[0] + pool.held[1]
    back = pool.release(1)
    assert [c.page for c in back] == [TRASH_PAGE] * 3 and pool.free_pages == 8 and pool.held[1] == []


def test_a_dry_pool_shrinks_the_ring_of_the_call_that_grows_and_drops_nobody():
    pool = PagePool(num_pages=1 + 4, page_size=16, window=64, num_slots=2)
    pool.grow(0, 48)  # 3 pages
    pool.grow(1, 1)  # the last page
    assert pool.free_pages == 0
    assert pool.grow(0, 49) == []  # wants its 4th page: none left
    assert pool.windows[0] == 48 and pool.capped_slots == 1  # its ring is now the 3 pages it holds
    pool.release(0)
    assert pool.windows[0] == 64 and pool.free_pages == 3  # the next session in slot 0 starts whole


def test_admission_counts_what_calls_will_hold_over_their_remaining_life():
    pool = PagePool(num_pages=1 + 60, page_size=10, window=60, num_slots=100)
    # calls that never end will each hold a full window (6 pages): the contiguous capacity, 60 / 6
    assert pool.admissible([], mean_call_positions=1e12) == 10
    assert pool.admissible([], mean_call_positions=30) == 42  # most short calls end before their window fills
    assert pool.admissible([], 120, new_positions=60) == 10  # a restored full context costs its pages now
    n = pool.admissible([], 120)
    assert n == 15
    for slot in range(n):
        pool.grow(slot, 1)
    assert pool.free_pages == 45 and pool.admissible([(s, 1) for s in range(n)], 120) == 0  # room now, not later
    for slot in range(n):  # the same calls 40 frames on: the pool is exactly full, no ring had to shrink
        pool.grow(slot, 40)
    assert pool.free_pages == 0 and pool.capped_slots == 0
    for slot in range(n // 2):  # half of them end
        pool.release(slot)
    older = [(s, 40) for s in range(n // 2, n)]
    assert pool.admissible(older, 120, z=0.0) == 7 > pool.admissible(older, 120) == 0  # 3 sd kept for their growth
    margin = PagePool(num_pages=1 + 60, page_size=10, window=60, num_slots=10)
    for slot in range(5):
        margin.grow(slot, 30)
    live = [(s, 30) for s in range(5)]
    assert margin.admissible(live, 120, z=0.0) == 10 > margin.admissible(live, 120) == 5


def test_a_call_whose_ring_shrank_still_counts_at_its_full_window():
    pools = []
    for shrink in (True, False):
        pool = PagePool(num_pages=1 + 20, page_size=10, window=60, num_slots=4)
        for slot, positions in ((0, 60), (2, 60), (1, 40), (3, 40)):
            pool.grow(slot, positions)
        if shrink:
            pool.grow(1, 41)  # the pool is dry: slot 1's ring stops at 40
        pool.release(0)
        pool.release(2)
        pools.append(pool)
    shrunk, whole = pools
    assert shrunk.windows[1] == 40 and whole.windows[1] == 60 and shrunk.free_pages == whole.free_pages == 12
    # the pages it could not get are owed, not spare: admission sees the same as for a call that grew normally
    live = [(1, 40), (3, 40)]
    assert shrunk.admissible(live, 60, z=0.0) == whole.admissible(live, 60, z=0.0) == 5


# ---- the step on pages -----------------------------------------------------------------------------------


def test_paged_rings_give_the_contiguous_tokens_through_wraparound(tiny):
    info, lm = tiny
    fast_lm = FastLM(lm)
    T, slots = 360, [0, 1, 2]  # past the 299-frame window
    codes = torch.randint(0, 2048, (T, 3, 8), generator=torch.Generator().manual_seed(5))
    contiguous = FastLockstep(fast_lm, num_slots=3, max_rows=3, sampling=GREEDY)
    paged = FastLockstep(fast_lm, num_slots=3, max_rows=3, sampling=GREEDY, kv_page_size=16)
    assert paged.kv.page_table.shape == (4, 19) and contiguous.kv.page_table.shape == (4, 1)
    # slot 2 starts 50 passes late, so the slots' pages interleave in the pool in no tidy order
    want = _run(contiguous, info, codes[:50, :2], [0, 1]) + _run(contiguous, info, codes[50:], slots)
    got = _run(paged, info, codes[:50, :2], [0, 1]) + _run(paged, info, codes[50:], slots)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    held = [paged.kv.pages.held[s] for s in slots]
    assert [len(h) for h in held] == [19, 19, 19] and len(set(sum(held, []))) == 57
    assert any(b - a != 1 for a, b in zip(held[0], held[0][1:], strict=False))  # a ring's pages are not side by side


def test_a_call_whose_ring_shrank_keeps_running_and_its_neighbour_is_untouched(tiny):
    info, lm = tiny
    fast_lm = FastLM(lm)
    codes = torch.randint(0, 2048, (360, 2, 8), generator=torch.Generator().manual_seed(6))
    alone = FastLockstep(fast_lm, num_slots=1, max_rows=1, sampling=GREEDY)
    expected = _run(alone, info, codes[:, 1:], [0])
    # 21 pages of 16: slot 1 fills its whole 299-frame ring (19 pages), then slot 0 joins with 2 pages left
    ls = FastLockstep(fast_lm, num_slots=2, max_rows=2, sampling=GREEDY, kv_page_size=16, kv_pages=21)
    first = _run(ls, info, codes[:300, 1:], [1])
    both = _run(ls, info, torch.stack([codes[300:, 0], codes[300:, 1]], dim=1), [0, 1])
    assert ls.kv.pages.free_pages == 0 and ls.kv.pages.capped_slots == 1
    assert ls.kv.pages.windows[0] == int(ls.kv.windows[0]) == 32  # slot 0 went on over a 32-frame ring
    assert all(bool((t[0] >= 0).all()) for t in both[20:])  # and it produced frames throughout
    # slot 1 had its pages before the pool ran dry: exactly what it gives alone, all 360 frames
    got = first + [t[1:] for t in both]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_a_snapshot_of_a_paged_slot_restores_into_other_pages(tiny):
    info, lm = tiny
    ls = FastLockstep(FastLM(lm), num_slots=3, max_rows=3, sampling=GREEDY, kv_page_size=16)
    codes = torch.randint(0, 2048, (70, 1, 8), generator=torch.Generator().manual_seed(7))
    _run(ls, info, codes[:40], [0])
    snap = snapshot_slot(ls, 0)
    _run(ls, info, codes[:10], [1])  # slot 1 takes pages, so slot 2's restored pages are others than slot 0's
    restore_slot(ls, 2, snap)
    assert set(ls.kv.pages.held[2]).isdisjoint(ls.kv.pages.held[0])
    after_0 = _run(ls, info, codes[40:], [0])
    after_2 = _run(ls, info, codes[40:], [2])
    assert all(torch.equal(a, b) for a, b in zip(after_0, after_2, strict=True))


# ---- the engine --------------------------------------------------------------------------------------


def paged_engine(info, num_slots: int, pool_pages: float) -> LockstepEngine:
    """The tiny pack's engine on pages of 16 frames, a pool of about ``pool_pages`` pages, 40-frame calls."""
    page_bytes = SlotKV.bytes_per_slot(info.lm, torch.float32, fp8=False) * 16 / info.lm.kv_window
    return LockstepEngine(
        DATA / "ckpt",
        num_slots=num_slots,
        greedy=True,
        prefill_cache_entries=0,
        kv_paging=KVPaging(page_frames=16, pool_gb=pool_pages * page_bytes / 1e9, mean_call_frames=40),
    )


def test_the_engine_rations_sessions_by_kv_memory_and_gives_it_back_on_close(tiny):
    engine = paged_engine(tiny[0], num_slots=4, pool_pages=6.5)
    engine.warmup()
    pages = engine.backend.lockstep.kv.pages
    assert pages.usable_pages == 6
    empty = engine.admissible_sessions()
    live = []
    assert empty == pages.admissible(live, 40) >= 2
    engine.open_slot(0, SlotConfig())
    engine.open_slot(1, SlotConfig())
    assert pages.free_pages == 4 and engine.admissible_sessions() < empty
    pages.grow(3, 64)  # a session in slot 3 took the rest
    for _ in range(ADMISSIBLE_REFRESH_PASSES):  # the estimate is fresh within that many passes
        engine.step({s: SlotInput(audio=np.zeros(FRAME_SAMPLES, np.float32)) for s in (0, 1)})
    assert engine.admissible_sessions() == 0
    with pytest.raises(EngineError, match="no KV memory"):  # refused with a clear error, nothing crashes
        engine.open_slot(2, SlotConfig())
    engine.close_slot(0)
    assert pages.held[0] == [] and pages.free_pages == 1
    pages.release(3)
    engine.close_slot(1)
    assert engine.admissible_sessions() == empty  # every page back: as many as at the start


def test_an_engine_with_fewer_pages_than_slots_warms_up_over_every_slot(tiny):
    engine = paged_engine(tiny[0], num_slots=6, pool_pages=2.5)
    engine.warmup()  # its last part ticks all 6 slots: their KV goes to the trash page, not the 2-page pool
    pages = engine.backend.lockstep.kv.pages
    assert pages.usable_pages == 2 and pages.free_pages == 2 and engine.backend.lockstep.passes[:6] == [0] * 6
    engine.open_slot(0, SlotConfig())
    assert pages.held[0] and pages.free_pages == 1
