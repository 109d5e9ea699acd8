"""The unit's host half against torch's intra-op thread count: the evidence behind the listen unit's p99 (issue 12).

bench/unit_gpu.py keeps every unit's host mel time (``mel_ms``: the carry and the log-mel over the session's
buffer, up to 30 s of audio, on the host). On the H200 machine (16 cores) its median was 1.8 ms and its p99 74 ms,
spikes in about one unit in eight at any point of the call, not growing with the buffer: the tail of the listen
unit. This runs, for each thread count, the same fast single sessions as unit_gpu.py (random weights at the real
shapes, 40 audio + 20 omni units each) and, on its own with the GPU idle, the log-mel of a 30 s buffer, and reports
median / p99 / max of both.

Usage (GPU machine)::

    python3 bench/unit_host_threads.py --threads 16,4,1 --out $OUT   # unit-host-threads-<gpu>-<commit>.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_result  # noqa: E402
from bench.unit_gpu import build_model, per_kind, stats  # noqa: E402
from bench.unit_sessions import one_session  # noqa: E402
from bench.unit_workload import DATA, REAL_45, make_audio  # noqa: E402
from inference.models.minicpmo.fast.runner import FastDuplexRunner  # noqa: E402


def mel_alone(front_end, reps: int) -> dict:
    audio = make_audio(30, 5)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        front_end.log_mel(audio, dynamic_floor=True)
        times.append((time.perf_counter() - t0) * 1000)
    return stats(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="16,4,1")
    parser.add_argument("--sessions", type=int, default=4, help="fast sessions per thread count")
    parser.add_argument("--mel-reps", type=int, default=300)
    parser.add_argument("--tiny", action="store_true", help="the golden pack's tiny config (a smoke run)")
    parser.add_argument("--out", default=None, help="a file, or a directory for the named result")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    default_threads = torch.get_num_threads()
    parts = build_model(dtype, json.loads((DATA / "config.json").read_text()) if args.tiny else REAL_45, device)
    runner = FastDuplexRunner(parts, num_slots=2)
    runner.capture(max_kv=4096)
    one_session(runner, 6, 2, seed=7)
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        runs = [one_session(runner, 40, 20, seed=11 + k) for k in range(args.sessions)]
        kinds = per_kind(runs)
        row = {
            "threads": threads,
            "mel_in_sessions": stats([u["mel_ms"] for r in runs for u in r["units"]]),
            "listen": {k: kinds["listen"][k] for k in ("n", "median_ms", "p99_ms", "max_ms")},
            "speak": {k: kinds["speak"][k] for k in ("n", "median_ms", "p99_ms", "max_ms")},
            "mel_alone_30s": mel_alone(parts.audio.front_end, args.mel_reps),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "bench": "unit_host_threads",
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "torch": torch.__version__,
        "default_threads": default_threads,
        "model": f"random MiniCPM-o 4.5 at the real shapes, {dtype} on {device}",
        "rows": rows,
    }
    print(f"wrote {write_result(result, 'unit-host-threads', gpu=True, out=args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
