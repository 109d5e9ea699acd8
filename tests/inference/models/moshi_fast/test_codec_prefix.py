"""``GraphedMimi`` over a prefix of the slots: the rows it runs come out as a step over every row gives them, and
the rows past it do not move (eager here; the graphed twin is tests/gpu/test_codec_prefix_gpu.py)."""

from __future__ import annotations

import torch

from inference.models.moshi.config import read_checkpoint_dir
from inference.models.moshi.fast.codec import GraphedMimi
from inference.models.moshi.mimi import per_row_tensors
from inference.models.moshi.mimi_config import MimiConfig
from inference.models.moshi.mimi_loading import load_mimi
from tests.inference.models.moshi_fast.tiny_pack import DATA

SLOTS = 12


def _codec():
    info = read_checkpoint_dir(DATA / "ckpt")
    return load_mimi(info.mimi_weights, MimiConfig.from_dict(info.mimi_config)).eval()


def test_a_prefix_step_matches_the_step_over_every_row_and_leaves_the_rest():
    codec = _codec()
    prefix = GraphedMimi(codec, SLOTS, prefixes=(4, 8))
    every = GraphedMimi(codec, SLOTS, prefixes=())
    assert prefix.prefixes == (4, 8, SLOTS) and every.prefixes == (SLOTS,)
    assert [prefix.prefix_for(s) for s in (0, 3, 4, 7, 8, 11)] == [4, 4, 8, 8, SLOTS, SLOTS]
    fresh = {path: t[8:].clone() for path, t in per_row_tensors(prefix.state)}
    g = torch.Generator().manual_seed(3)
    live = torch.tensor([0, 2, 5])
    for _ in range(5):  # several frames: the state (conv tails, the transformers' rings) carries over
        pcm = torch.randn(3, 1, prefix.frame, generator=g) * 0.1
        codes = prefix.encode(pcm, live, highest_row=5)
        assert torch.equal(codes, every.encode(pcm, live)), "the prefix's codes are the full step's"
        out = prefix.decode(codes, live, highest_row=5)
        torch.testing.assert_close(out, every.decode(codes, live), rtol=0, atol=1e-5)
    after = dict(per_row_tensors(prefix.state))
    assert all(torch.equal(after[path][8:], rows) for path, rows in fresh.items()), "rows past the prefix stay fresh"
    assert any(
        not torch.equal(after[path][:8], every_rows[:8])
        for path, every_rows in per_row_tensors(codec.init_stream(SLOTS))
    )
    for path, rows in per_row_tensors(every.state):  # the prefix's rows were stepped in place in the full state
        torch.testing.assert_close(after[path][:8], rows[:8], rtol=0, atol=1e-5)


def test_a_joining_slot_past_the_prefix_widens_it_from_a_fresh_row():
    codec = _codec()
    prefix = GraphedMimi(codec, SLOTS, prefixes=(4,))
    every = GraphedMimi(codec, SLOTS, prefixes=())
    g = torch.Generator().manual_seed(5)
    for step in range(4):
        live = torch.tensor([1]) if step < 2 else torch.tensor([1, 9])  # slot 9 joins at the third frame
        highest = int(live.max())
        if step == 2:
            prefix.reset_slot(9)
            every.reset_slot(9)
        pcm = torch.randn(len(live), 1, prefix.frame, generator=g) * 0.1
        codes = prefix.encode(pcm, live, highest_row=highest)
        assert torch.equal(codes, every.encode(pcm, live))
        torch.testing.assert_close(
            prefix.decode(codes, live, highest_row=highest), every.decode(codes, live), rtol=0, atol=1e-5
        )


def test_a_call_moved_to_a_lower_row_goes_on_as_if_it_had_stayed():
    codec = _codec()
    moved = GraphedMimi(codec, SLOTS, prefixes=(4, 8))
    stayed = GraphedMimi(codec, SLOTS, prefixes=())  # every row, slot = row: the reference
    g = torch.Generator().manual_seed(7)

    def frame(slots: list[int]) -> None:
        pcm = torch.randn(len(slots), 1, moved.frame, generator=g) * 0.1
        rows, highest = moved.rows_of(slots)
        codes = moved.encode(pcm, rows, highest)
        assert torch.equal(codes, stayed.encode(pcm, torch.tensor(slots)))
        torch.testing.assert_close(
            moved.decode(codes, rows, highest), stayed.decode(codes, torch.tensor(slots)), rtol=0, atol=1e-5
        )

    for _ in range(3):  # two calls, on slots 1 and 9: the step runs over all 12 rows to reach row 9
        frame([1, 9])
    assert moved.compact({1, 9})  # two calls fit the 4-row prefix: slot 9's call moves to row 0, the lowest free
    assert (moved.row_of[9], moved.row_of[0], moved.slot_at[0], moved.slot_at[9], moved.moves) == (0, 9, 9, 0, 1)
    assert not moved.compact({1, 9}), "nothing left to gain"
    assert moved.prefix_for(moved.rows_of([1, 9])[1]) == 4
    for _ in range(3):
        frame([1, 9])
    moved.reset_slot(0)  # a new call on slot 0 starts on the row slot 9 left, fresh; slot 9's stream is untouched
    stayed.reset_slot(0)
    for _ in range(3):
        frame([0, 1, 9])
