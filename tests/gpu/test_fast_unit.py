"""Unit engine fast path on a GPU: the captured decode graphs reproduce the tiny golden calls and the eager path.

Skipped without CUDA (CI). float32 on the tiny golden checkpoint: tokens, TTS codes and cache lengths must be
exact (against the goldens and against the eager runner on the same device). The real-shape bf16 comparison
lives in ``bench/unit_gpu.py`` because it needs the 9 B model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from inference.models.minicpmo.duplex import DuplexRunner  # noqa: E402
from inference.models.minicpmo.fast.runner import FastDuplexRunner  # noqa: E402
from inference.models.minicpmo.fast.streams import RecordedCall, run_calls  # noqa: E402
from inference.models.minicpmo.fill import make_checkpoint  # noqa: E402
from inference.models.minicpmo.loading import load_model  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "minicpmo45"
SCENARIOS = ("audio8", "omni6", "turnclose10")
EXACT = ("llm_ids", "text", "tts_codes", "kv_len", "is_listen", "end_of_turn", "prefill_schema")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    torch.set_grad_enabled(False)
    ckpt = make_checkpoint(tmp_path_factory.mktemp("minicpmo"), data_dir=DATA, seed=1234)
    return load_model(ckpt, device="cuda", dtype=torch.float32)


def _calls():
    goldens = [json.loads((DATA / s / "golden.json").read_text()) for s in SCENARIOS]
    return [
        RecordedCall.from_scenario(DATA / s, g["options"]) for s, g in zip(SCENARIOS, goldens, strict=True)
    ], goldens


def test_graphed_fast_path_reproduces_the_goldens_and_the_eager_path(parts):
    calls, goldens = _calls()
    fast = FastDuplexRunner(parts, num_slots=4)
    assert fast.capture(max_kv=512) > 0
    batched = run_calls(fast, calls)  # three calls per tick: graphs of 2 and 3 rows (bucket 4)
    alone = [run_calls(fast, [c])[0] for c in calls]  # the 1-row graphs
    eager = [run_calls(DuplexRunner(parts), [c])[0] for c in calls]
    assert fast.fast_llm.graphs.graphs and fast.fast_tts.graphs.graphs
    for golden, b, a, e in zip(goldens, batched, alone, eager, strict=True):
        for unit, ub, ua, ue in zip(golden["units"], b, a, e, strict=True):
            for field in EXACT:
                assert ub[field] == ua[field] == ue[field] == unit[field], f"unit {unit['unit']} {field}"
            np.testing.assert_allclose(ub["raw_top2_margins"], unit["raw_top2_margins"], rtol=0, atol=5e-5)
