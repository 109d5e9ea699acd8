"""Greedy equality at the real MiniCPM-o 4.5 shapes in bfloat16: the fast path decides the eager path's ids.

The model is the bench's (``bench/unit_gpu.py``: random weights at the published shapes, 9.35 B parameters,
built on the GPU, the speaking rule applied), and so are the 30 units (20 audio, 10 omni with a 448x448 frame).
Both runners reduce through the row-invariant kernels (``inference/models/minicpmo/invariant``), so the eager
session alone, the fast session alone and the fast session ticked with three others must agree id for id.
Skipped without CUDA (CI).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from bench.unit_equality import greedy_equality  # noqa: E402
from bench.unit_gpu import build_model  # noqa: E402
from bench.unit_workload import REAL_45  # noqa: E402
from inference.models.minicpmo.duplex import DuplexRunner  # noqa: E402
from inference.models.minicpmo.fast.runner import FastDuplexRunner  # noqa: E402


@pytest.fixture(scope="module")
def equality():
    torch.set_grad_enabled(False)
    parts = build_model(torch.bfloat16, REAL_45, "cuda")
    fast = FastDuplexRunner(parts, num_slots=5)
    fast.capture(max_kv=2048)
    result = greedy_equality(DuplexRunner(parts), fast)
    del fast, parts
    torch.cuda.empty_cache()
    return result


def test_fast_path_decides_the_eager_ids_over_30_units_in_bf16(equality):
    assert equality["units"] == 30
    assert equality["units_speaking"] >= 10 and equality["ids_compared"] >= 60  # not only forced listens
    assert equality["units_with_same_decision"] == 30
    assert equality["eager_ids"] == equality["fast_ids"], equality["first_difference_unit"]


def test_a_session_ticked_with_others_decides_as_it_does_alone(equality):
    assert equality["batched_units_with_identical_ids"] == 30


def test_on_the_same_history_every_decoding_step_agrees(equality):
    same = equality["same_history"]
    assert same["decision_steps"] >= 60 and same["same_id"] == same["decision_steps"], same
