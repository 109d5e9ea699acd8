"""Measure how far float comparisons in the tests are from their tolerances, per CPU code path.

MKL and PyTorch pick their kernels by processor (MKL's code branch, ATen's CPU capability, oneDNN's
ISA) and split reductions by thread count, so a float result differs in its last bits between
machines. The tolerances of the numerical tests are chosen from what this tool measures, and each
says so where it is written. ``scripts/float-spread.sh`` runs the numerical tests once per code
path with this file loaded as a pytest plugin, then prints the report.

As a plugin (``pytest -p tests.float_spread``, with ``PARLEY_FLOAT_SPREAD_OUT=file.json``), it
wraps ``numpy.testing.assert_allclose`` and ``torch.testing.assert_close``: every call records, by
the test line that made it, the largest absolute difference, the largest relative difference
(over expected values of magnitude at least ``REL_FLOOR``), the largest expected magnitude and
the tolerance the test asked for. With ``PARLEY_FLOAT_SPREAD_RECORD_ONLY=1`` the assertions do not
raise, so a run measures every comparison even where a tolerance is too tight.

As a command (``python -m tests.float_spread report a.json b.json ...``), it prints, per call site,
the largest differences in each run and over all runs, next to the tolerance in force.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np

REL_FLOOR = 1e-3  # relative differences of values near zero say nothing; atol covers those
ROOT = Path(__file__).resolve().parents[1]


def _call_site() -> str:
    """``tests/...py:LINE`` of the innermost test-suite frame that called the assertion."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = Path(frame.filename)
        if path.is_relative_to(ROOT / "tests") and path.name != Path(__file__).name:
            return f"{path.relative_to(ROOT)}:{frame.lineno}"
    return "?"


def _differences(actual, expected) -> tuple[float, float, float]:
    a = np.asarray(_to_numpy(actual), dtype=np.float64)
    b = np.asarray(_to_numpy(expected), dtype=np.float64)
    a, b = np.broadcast_arrays(a, b)
    if a.size == 0:
        return 0.0, 0.0, 0.0
    diff = np.abs(a - b)
    big = np.abs(b) >= REL_FLOOR
    rel = float((diff[big] / np.abs(b[big])).max()) if big.any() else 0.0
    return float(diff.max()), rel, float(np.abs(b).max())


def _to_numpy(value):
    if hasattr(value, "detach"):
        return value.detach().cpu().double().numpy()
    return value


class Recorder:
    def __init__(self, out: Path, record_only: bool):
        self.out, self.record_only, self.sites = out, record_only, {}

    def record(self, actual, expected, rtol, atol) -> None:
        try:
            max_abs, max_rel, magnitude = _differences(actual, expected)
        except (TypeError, ValueError):  # non-numeric or mismatched shapes: the assertion itself will say
            return
        site = self.sites.setdefault(
            _call_site(), {"max_abs": 0.0, "max_rel": 0.0, "magnitude": 0.0, "rtol": rtol, "atol": atol, "calls": 0}
        )
        site["max_abs"] = max(site["max_abs"], max_abs)
        site["max_rel"] = max(site["max_rel"], max_rel)
        site["magnitude"] = max(site["magnitude"], magnitude)
        site["calls"] += 1

    def save(self) -> None:
        self.out.write_text(json.dumps(self.sites, indent=1, sort_keys=True))


_recorder: Recorder | None = None


def pytest_configure(config) -> None:
    global _recorder
    out = os.environ.get("PARLEY_FLOAT_SPREAD_OUT")
    if not out:
        return
    import torch

    _recorder = Recorder(Path(out), record_only=os.environ.get("PARLEY_FLOAT_SPREAD_RECORD_ONLY") == "1")
    numpy_assert, torch_assert = np.testing.assert_allclose, torch.testing.assert_close

    def assert_allclose(actual, desired, rtol=1e-7, atol=0, *args, **kwargs):
        _recorder.record(actual, desired, rtol, atol)
        if not _recorder.record_only:
            numpy_assert(actual, desired, rtol, atol, *args, **kwargs)

    def assert_close(actual, expected, *args, rtol=None, atol=None, **kwargs):
        _recorder.record(actual, expected, rtol, atol)
        if not _recorder.record_only:
            torch_assert(actual, expected, *args, rtol=rtol, atol=atol, **kwargs)

    np.testing.assert_allclose, torch.testing.assert_close = assert_allclose, assert_close


def pytest_unconfigure(config) -> None:
    if _recorder is not None:
        _recorder.save()


def report(paths: list[Path]) -> str:
    runs = {path.stem: json.loads(path.read_text()) for path in paths}
    sites = sorted({site for run in runs.values() for site in run})
    lines = []
    for site in sites:
        seen = {name: run[site] for name, run in runs.items() if site in run}
        first = next(iter(seen.values()))
        worst_abs = max(s["max_abs"] for s in seen.values())
        worst_rel = max(s["max_rel"] for s in seen.values())
        lines.append(
            f"{site}  (rtol={first['rtol']}, atol={first['atol']}, |expected| <= {first['magnitude']:.3g}): "
            f"max abs {worst_abs:.3g}, max rel {worst_rel:.3g} over {len(seen)} runs"
        )
        for name, s in seen.items():
            lines.append(f"    {name:<40} abs {s['max_abs']:.3g}  rel {s['max_rel']:.3g}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "report":
        sys.exit("usage: python -m tests.float_spread report RUN.json...")
    print(report([Path(p) for p in sys.argv[2:]]))
