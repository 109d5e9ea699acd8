"""The unit LLM's attention at the ages calls reach: the invariant kernel of a base commit against this tree's.

A unit engine's decode step runs every live session as one row, with one key bucket for all of them, set by
the oldest call. This times one layer's attention over rows whose lengths are the contexts of live calls in
the 3-minute mix (ages exponential around ``--mean-call-s``, ``AUDIO_UNIT_MAX_POSITIONS`` positions a second,
up to the sliding window's trigger), young calls for contrast, and a unit's prefill of ``PREFILL_T``
positions. Both kernels run in one process on the same tensors, each captured in a CUDA graph of back-to-back
launches; the output must be the same bits (the change is meant to move fewer bytes, not other numbers).

The base kernel comes from ``git show <base>:inference/models/minicpmo/invariant/kernels.py`` where git is
at hand, or from ``--base-file`` (the device's copy of the tree has no ``.git``: write the file into the
carry first).

Usage (GPU machine): python3 bench/unit_attention_aged.py --base 9d6fc1c --base-file .venv-loadpath/kernels_base.py --out $OUT
(``--base`` then only names the commit the file came from.)
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_result  # noqa: E402
from bench.unit_invariant_kernels import HD, KV_HEADS, Q_HEADS, graphed_us  # noqa: E402
from inference.engines.unit import AUDIO_UNIT_MAX_POSITIONS  # noqa: E402  (an audio-only unit's most positions)
from inference.models.minicpmo.duplex import window_bounds  # noqa: E402
from inference.models.minicpmo.fast.graphs import kv_buckets, smallest_at_least  # noqa: E402
from inference.models.minicpmo.fast.runner import DEFAULT_CAPACITY  # noqa: E402
from inference.models.minicpmo.invariant import kernels as ours  # noqa: E402

KERNELS = "inference/models/minicpmo/invariant/kernels.py"
PROMPT_POSITIONS = 200
PREFILL_T = 13


def load_base(base: str | None, base_file: Path | None):
    """The kernels module of ``base`` (a commit) or of ``base_file``, imported under its own name."""
    if base_file is None:
        source = subprocess.run(["git", "show", f"{base}:{KERNELS}"], capture_output=True, text=True, check=True)
        base_file = Path(tempfile.mkdtemp()) / "kernels_base.py"
        base_file.write_text(source.stdout)
    spec = importlib.util.spec_from_file_location("kernels_base", base_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # Triton reads the kernels' source from the file: it must stay
    return module


def call_lengths(rows: int, mean_call_s: float, rng: np.random.Generator) -> list[int]:
    """Context lengths of ``rows`` live calls of the mix: a live call's age is exponential too (memoryless)."""
    trigger, _ = window_bounds(DEFAULT_CAPACITY)
    ages = rng.exponential(mean_call_s, rows)
    return [int(min(PROMPT_POSITIONS + a * AUDIO_UNIT_MAX_POSITIONS, trigger)) for a in ages]


def case(name: str, lengths: list[int], t: int, base, bf16=torch.bfloat16) -> dict:
    r = len(lengths)
    kv_len = smallest_at_least(max(lengths) + 1, kv_buckets(DEFAULT_CAPACITY))
    pool_k = torch.randn(r + 1, KV_HEADS, kv_len, HD, device="cuda", dtype=bf16)
    pool_v = torch.randn_like(pool_k)
    q = torch.randn(r, Q_HEADS, t, HD, device="cuda", dtype=bf16)
    slots = torch.arange(r, device="cuda")
    starts = torch.tensor([n - t for n in lengths], device="cuda")
    args = (q, pool_k, pool_v, slots, starts, kv_len, HD**-0.5)
    same = torch.equal(base.attention(*args, causal=True), ours.attention(*args, causal=True))
    base_us = graphed_us(lambda: base.attention(*args, causal=True))
    ours_us = graphed_us(lambda: ours.attention(*args, causal=True))
    key_bytes = 2 * sum(lengths) * KV_HEADS * HD * pool_k.element_size()  # keys and values each row reads
    row = {
        "case": name,
        "rows": r,
        "positions": t,
        "kv_bucket": kv_len,
        "length_mean": round(float(np.mean(lengths)), 1),
        "length_max": max(lengths),
        "base_us": round(base_us, 1),
        "ours_us": round(ours_us, 1),
        "ratio": round(ours_us / base_us, 3),
        "ours_kv_gb_per_s": round(key_bytes / ours_us / 1e3, 1),
        "same_bits": same,
    }
    print(row, flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--base", default="HEAD~1", help="the commit whose kernel is the base (its name, with --base-file)"
    )
    parser.add_argument("--base-file", type=Path, default=None, help="the base kernels.py itself")
    parser.add_argument("--mean-call-s", type=float, default=180.0)
    parser.add_argument("--draws", type=int, default=3, help="call-age draws per row count")
    parser.add_argument("--out", type=Path, default=None, help="a file, or a directory for the named result")
    args = parser.parse_args()
    base = load_base(args.base, args.base_file)
    rng = np.random.default_rng(0)
    rows = []
    for r in (16, 64):
        rows.append(case("young calls (1 000 positions)", [1000] * r, 1, base))
        for draw in range(args.draws):
            lengths = call_lengths(r, args.mean_call_s, rng)
            rows.append(case(f"calls of the mix, draw {draw}", lengths, 1, base))
            rows.append(case(f"calls of the mix, draw {draw}, a unit's prefill", lengths, PREFILL_T, base))
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "base": args.base,
        "mean_call_s": args.mean_call_s,
        "rows": rows,
    }
    print(f"wrote {write_result(result, 'unit-attention-aged', gpu=True, out=args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
