"""Token-for-token parity with moshi 0.2.13's LMGen (greedy, fp32, CPU) on tiny random checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from inference.models.moshi.config import read_checkpoint_dir
from inference.models.moshi.replay import replay
from tests.inference.models.moshi.moshi_lm_helpers import make_lm_dir, run_reference, user_codes

pytestmark = pytest.mark.reference

CONFIGS = {
    # the 7B structure shrunk; context 64 < 210 frames, so the KV ring wraps three times
    "tiny-moshiko-seed1": dict(context=64),
    # other widths: FFN = 4 * dim (moshi's 21/8 hidden rule), 6 heads, 3 layers, 1 depformer layer
    "wide-seed7": dict(
        dim=96,
        num_heads=6,
        num_layers=3,
        hidden_scale=4,
        context=40,
        depformer_dim=48,
        depformer_num_heads=4,
        depformer_num_layers=1,
        depformer_dim_feedforward=192,
    ),
}


def _compare(ours: np.ndarray, expected: np.ndarray) -> None:
    for index in np.ndindex(expected.shape[:-1]):
        assert (ours[index] == expected[index]).all(), (
            f"frame {index}: ours {ours[index].tolist()} != reference {expected[index].tolist()}"
        )


def test_tiny_moshiko_equals_reference_frame_by_frame(tmp_path):
    ckpt = make_lm_dir(tmp_path / "ckpt", 1, **CONFIGS["tiny-moshiko-seed1"])
    codes = user_codes(1, (8, 210))
    expected = run_reference(ckpt, codes, tmp_path)
    ours = replay(read_checkpoint_dir(ckpt), codes, greedy=True)
    assert expected.shape == ours.shape == (209, 9)
    _compare(ours, expected)
    assert len(np.unique(ours[:, 1])) > 10  # non-trivial: not a constant stream


def test_other_widths_batch_of_two_equals_reference(tmp_path):
    ckpt = make_lm_dir(tmp_path / "ckpt", 7, **CONFIGS["wide-seed7"])
    codes = user_codes(7, (2, 8, 200))
    expected = run_reference(ckpt, codes, tmp_path)
    ours = replay(read_checkpoint_dir(ckpt), codes, greedy=True)
    assert expected.shape == ours.shape == (2, 199, 9)
    _compare(ours, expected)
    assert not (ours[0] == ours[1]).all()
