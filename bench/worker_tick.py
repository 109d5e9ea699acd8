"""The engine worker's own host cost per call per tick, with nothing else in the process.

``EngineWorker`` over the echo engine (which does no work of its own) with ``--slots`` open slots, each pushed
one 80 ms frame per tick, ticked back to back on this thread: what is left is the worker's framers' takes,
the slot inputs and outputs, the PCM16 conversion and the hand-off to the listeners. The GPU service's tick
split (``bench/serving_gpu_service.py --tick-split-log``) shows the host's share of a served tick beside the
device's; this is the same work without the callers' sockets sharing the interpreter. ``--profile`` prints
cProfile's top functions over 200 more ticks. The result goes to ``bench/results/worker-tick-<slots>slots-...``
(``--out``: a directory or a file).

    .venv/bin/python bench/worker_tick.py --slots 130
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_result  # noqa: E402
from inference.engines.base import SlotConfig  # noqa: E402
from inference.engines.echo import EchoEngine  # noqa: E402
from inference.slots.worker import EngineWorker  # noqa: E402


class DiscardingListener:
    def slot_output(self, output, pcm16, heard_position) -> None:
        pass

    def slot_failed(self, message: str) -> None:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, default=130)
    p.add_argument("--ticks", type=int, default=300)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--out", default=None, help="a directory, or a file name, for the result")
    args = p.parse_args()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    worker = EngineWorker(EchoEngine(args.slots, delay_frames=0))
    for slot in range(args.slots):
        worker.open(slot, SlotConfig(), DiscardingListener(), loop)
    rng = np.random.default_rng(0)
    frames = [(rng.standard_normal(1920) * 0.1).astype(np.float32) for _ in range(8)]

    def run(ticks: int) -> None:
        for t in range(ticks):
            for slot in range(args.slots):
                worker.push(slot, frames[(t + slot) % 8])
            worker._tick()

    run(50)  # opens, then the framers settle
    run(args.ticks)
    ticks = np.asarray(worker.tick_ms.recent(args.ticks))
    p50, p99 = np.percentile(ticks, [50, 99])
    print(f"{args.slots} slots, {args.ticks} ticks: tick p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
          f"{p50 * 1000 / args.slots:.1f} us a call a tick")  # fmt: skip
    result = {
        "bench": "worker_tick",
        "slots": args.slots,
        "ticks": args.ticks,
        "tick_ms": {"p50": round(float(p50), 3), "p99": round(float(p99), 3)},
        "us_per_call_per_tick_p50": round(float(p50) * 1000 / args.slots, 2),
    }
    print(write_result(result, f"worker-tick-{args.slots}slots", out=args.out))
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        run(200)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
