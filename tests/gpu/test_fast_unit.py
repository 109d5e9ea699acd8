"""Unit engine fast path on a GPU: the captured decode graphs reproduce the tiny golden calls and the eager path.

Skipped without CUDA (CI). The runner's CUDA defaults are under test: decode steps and prefills through the
row-invariant kernels (``invariant``), which ``load_model`` also gives the eager modules on CUDA. float32 on
the tiny golden checkpoint: tokens, TTS codes and cache lengths must be exact (against the goldens and against
the eager runner on the same device). The real-shape bf16 comparison is ``test_unit_bf16_equality.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from inference.models.minicpmo.duplex import DuplexRunner  # noqa: E402
from inference.models.minicpmo.fast.runner import FastDuplexRunner  # noqa: E402
from inference.models.minicpmo.fast.streams import run_calls  # noqa: E402
from inference.models.minicpmo.fast.tts import FastTTS  # noqa: E402
from inference.models.minicpmo.fill import make_checkpoint  # noqa: E402
from inference.models.minicpmo.loading import load_model  # noqa: E402
from tests.inference.models.minicpmo.steering import (  # noqa: E402
    early_stopping_tts,
    golden_calls,
    listen_likely,
    run_to_the_cap,
    two_units_fast_and_eager,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "minicpmo45"
EXACT = ("llm_ids", "text", "tts_codes", "kv_len", "is_listen", "end_of_turn", "prefill_schema")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    torch.set_grad_enabled(False)
    # float32 on the GPU means float32: no TF32 in cuDNN's convolutions (the audio stem, the patch embedding).
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    ckpt = make_checkpoint(tmp_path_factory.mktemp("minicpmo"), data_dir=DATA, seed=1234)
    return load_model(ckpt, device="cuda", dtype=torch.float32)


@pytest.fixture(scope="module")
def runs(parts):
    goldens, calls = golden_calls(DATA)
    fast = FastDuplexRunner(parts, num_slots=4)
    assert fast.capture(max_kv=512) > 0
    batched = run_calls(fast, calls)  # three calls per tick: the 2- and 4-row graphs
    alone = [run_calls(fast, [c])[0] for c in calls]  # the 1-row graphs
    eager = [run_calls(DuplexRunner(parts), [c])[0] for c in calls]
    assert fast.fast_llm.graphs.graphs and fast.fast_tts.graphs.graphs
    return goldens, batched, alone, eager


def _diff(a: list[dict], b: list[dict]) -> str | None:
    for ua, ub in zip(a, b, strict=True):
        for field in EXACT:
            if ua[field] != ub[field]:
                return f"unit {ua['unit']} {field}: {ua[field]} != {ub[field]}"
    return None


def test_graphed_fast_path_equals_the_eager_path_batched_and_alone(runs):
    _, batched, alone, eager = runs
    for b, a, e in zip(batched, alone, eager, strict=True):
        assert _diff(b, e) is None, _diff(b, e)
        assert _diff(a, e) is None, _diff(a, e)
        for ub, ue in zip(b, e, strict=True):
            np.testing.assert_allclose(ub["raw_top2_margins"], ue["raw_top2_margins"], rtol=0, atol=5e-5)


def test_graphed_fast_path_reproduces_the_goldens(runs):
    goldens, batched, _, _ = runs
    for golden, b in zip(goldens, batched, strict=True):
        assert _diff(b, golden["units"]) is None, _diff(b, golden["units"])


def test_graphed_step_ahead_refeeds_wrong_guesses_as_the_eager_path_decides(parts):
    """On the device the step ahead is launched before the host reads the ids (pinned copy, event): with listen
    made likely mid-turn and with units run to the id cap (the CPU twins are in
    tests/inference/models/minicpmo/test_fast_path.py) the batched graphed calls decide exactly as the eager
    runner does."""
    calls = golden_calls(DATA)[1]
    for steered in (listen_likely(parts), run_to_the_cap(parts)):
        fast = FastDuplexRunner(steered, num_slots=4)
        fast.capture(max_kv=512)
        got = run_calls(fast, calls)
        want = [run_calls(DuplexRunner(steered), [c])[0] for c in calls]
        for g, w in zip(got, want, strict=True):
            assert _diff(g, w) is None, _diff(g, w)


def test_graphed_tts_rows_stopping_early_equal_the_eager_decode(parts):
    """The TTS codes stay on the device and eos is read every few steps: rows that stop at different codes
    equal the eager decode, codes and positions, through two units of the turn."""
    tts, conditions, min_codes = early_stopping_tts(parts)
    fast = FastTTS(tts, num_slots=8, max_rows=8)
    fast.graphs.capture_all()
    lengths = two_units_fast_and_eager(fast, tts, conditions, min_codes)
    assert len(lengths) >= 3 and 25 in lengths, lengths
