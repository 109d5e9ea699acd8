"""The reference's half of bench/unit_gpu.py's side by side (issue 12): bench/unit_reference.py run in a child
process on its own wheels, and its measurement set beside ours with the ratios."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_reference(args, out: Path) -> dict:
    """bench/unit_reference.py in a child process (its transformers 4.51 from ``--reference-site`` must not meet
    ours), saving the weights it ran; returns its results. The child exits before ours loads: the GPU is ours."""
    audio_units, omni_units = args.reference_units.split(",")
    command = [args.reference_python, str(ROOT / "bench" / "unit_reference.py"), "--src", str(args.reference_src),
               "--save-checkpoint", str(args.reference_checkpoint), "--audio-units", audio_units,
               "--omni-units", omni_units, "--out", str(out)] + (["--tiny"] if args.tiny else [])  # fmt: skip
    env = dict(os.environ)
    if args.reference_site:
        env["PYTHONPATH"] = str(args.reference_site)
    t0 = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    print(f"reference done in {time.perf_counter() - t0:.0f} s", flush=True)
    return json.loads(out.read_text())


def reference_side(reference: dict, ours: dict) -> dict:
    """The reference's measurement beside ours, per unit kind: median and p99 of each, and ours / theirs."""
    theirs = reference["measurement"]["per_kind"]
    side, ratios = {}, {}
    for kind in ("listen", "speak", "omni_listen", "omni_speak"):
        ref_unit, our_unit = theirs[kind]["unit"], ours[kind]
        side[kind] = {"reference": ref_unit, "parley_fast": {k: our_unit.get(k) for k in ("n", "median_ms", "p99_ms")}}
        if ref_unit.get("n") and our_unit.get("n"):
            ratios[kind] = {q: round(our_unit[q] / ref_unit[q], 3) for q in ("median_ms", "p99_ms")}
    return {
        "what": reference["reference"],
        "model": reference["model"],
        "transformers": reference["transformers"],
        "same_weights": "ours loaded the checkpoint the reference saved after its build",
        "units_per_kind": side,
        "ratios": ratios,
        "reference_prepare_ms": reference["measurement"]["prepare_ms"],
        "reference_build_s": reference["build_s"],
        "reference_peak_allocated_sessions_gb": reference["peak_allocated_sessions_gb"],
        "reference_units": reference["measurement"]["units"],
    }
