"""Slots of one batch are independent: joining, leaving, pausing and resuming never disturb other slots."""

from __future__ import annotations

import pytest
import torch

from inference.models.moshi.config import read_checkpoint_dir
from inference.models.moshi.gen import LockstepGen, SamplingConfig
from inference.models.moshi.loading import load_lm
from inference.models.moshi.replay import live_steps
from tests.inference.models.moshi.moshi_lm_helpers import make_lm_dir, user_codes

T = 90


@pytest.fixture(scope="module", params=[8, 16], ids=["dep_q8", "dep_q16"])
def lm(request, tmp_path_factory):
    ckpt = make_lm_dir(tmp_path_factory.mktemp("ckpt"), seed=11, context=24, dep_q=request.param)
    info = read_checkpoint_dir(ckpt)
    return load_lm(info.moshi_weights, info.lm)


def solo(lm, codes: torch.Tensor) -> torch.Tensor:
    gen = LockstepGen(lm, 1, SamplingConfig(use_sampling=False))
    return live_steps(gen, codes[None], keep_first=True)[0]  # [T, 1 + dep_q]


def test_slots_joining_pausing_and_resetting_equal_solo_runs(lm):
    K = lm.config.num_codebooks
    sessions = {name: torch.from_numpy(user_codes(i, (8, T))) for i, name in enumerate(["a", "b_old", "b", "c"])}
    expected = {name: solo(lm, codes) for name, codes in sessions.items()}
    # slot 0: "a" from tick 0. slot 1: "b_old" ticks 0..16, then reset and "b" from tick 17.
    # slot 2: idle until tick 40, then "c", paused (frozen) during ticks 60..69, then resumed.
    plan = {0: [("a", t, t) for t in range(T)], 1: [], 2: []}
    plan[1] = [("b_old", t, t) for t in range(17)] + [("b", t - 17, t) for t in range(17, 17 + T)]
    c_ticks = [t for t in range(40, 200) if not 60 <= t < 70][:T]
    plan[2] = [("c", i, t) for i, t in enumerate(c_ticks)]
    by_tick: dict[int, dict[int, tuple[str, int]]] = {}
    for slot, entries in plan.items():
        for name, frame, tick in entries:
            by_tick.setdefault(tick, {})[slot] = (name, frame)
    gen = LockstepGen(lm, 3, SamplingConfig(use_sampling=False))
    got = {name: [] for name in sessions}
    for tick in range(max(by_tick) + 1):
        feeds = by_tick.get(tick, {})
        forced = torch.zeros(3, K, dtype=torch.long)
        mask = torch.zeros(3, K, dtype=torch.bool)
        exec_mask = torch.zeros(3, dtype=torch.bool)
        reset = torch.zeros(3, dtype=torch.bool)
        for slot, (name, frame) in feeds.items():
            forced[slot, K - 8 :] = sessions[name][:, frame]
            mask[slot, K - 8 :] = True
            exec_mask[slot] = True
            reset[slot] = frame == 0
        if reset.any():
            gen.reset(reset)
        out = gen.step(forced, mask, exec_mask)
        for slot, (name, _) in feeds.items():
            got[name].append(out.tokens[slot].clone())
        assert (out.tokens[~exec_mask] == -2).all(), "frozen slots return nothing"
    for name in sessions:
        rows = torch.stack(got[name])
        assert rows.shape[0] == (17 if name == "b_old" else T)
        for t in range(rows.shape[0]):
            assert torch.equal(rows[t], expected[name][t]), f"session {name} frame {t}"
    assert not torch.equal(expected["a"], expected["b"])


def test_sampling_is_reproducible_and_differs_from_greedy(lm):
    codes = torch.from_numpy(user_codes(3, (8, 30)))[None]
    runs = []
    for seed in (1, 1, 2):
        gen = LockstepGen(lm, 1, SamplingConfig(), torch.Generator().manual_seed(seed))
        runs.append(live_steps(gen, codes, keep_first=True))
    greedy = live_steps(LockstepGen(lm, 1, SamplingConfig(use_sampling=False)), codes, keep_first=True)
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])
    assert not torch.equal(runs[0], greedy)
    valid = runs[0][1:]
    assert (valid[:, 1:] < lm.config.card).all() and (valid[:, 0] < lm.config.text_card).all()
