"""Recorder benchmark: what recording costs the engine tick, at N concurrent echo sessions.

One ``EngineWorker`` runs the echo engine with N slots on the real 80 ms clock; a feeder thread
pushes one input chunk per slot per tick (speech-like noise, so nothing compresses away). The run
alternates segments without and with a recording attached to every slot (same process, same
engine, same load), and compares the worker's own tick durations (``worker.tick_ms``: everything
a tick does, including handing the step to the recorder; the writer thread competes for the same
CPU and GIL, so its cost shows up there too).

Also reported: bytes written per call-minute (raw chunk files), and items the recorder dropped.

Usage::

    .venv/bin/python bench/recorder.py --sessions 64 --segment-s 15 --rounds 2

Writes JSON (default ``bench/results/recorder-<N>sessions-<cores>core-<commit>.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results_io import write_result  # noqa: E402
from bench.stats import summary  # noqa: E402
from inference.engines.base import SlotConfig  # noqa: E402
from inference.engines.echo import EchoEngine  # noqa: E402
from inference.recording.chunks import folder_size  # noqa: E402
from inference.recording.recorder import Recorder  # noqa: E402
from inference.slots.timing import TimingRing  # noqa: E402
from inference.slots.worker import EngineWorker  # noqa: E402

MAX_SESSIONS = 256
MAX_SEGMENT_S = 120
BUDGET_MS = 1.0  # the bound on what recording may add to the tick p99


class Discard:
    """A slot listener that drops every output (the transport is not what is measured here)."""

    def slot_output(self, output, pcm16, heard_position) -> None:
        pass

    def slot_failed(self, message: str) -> None:
        print("slot failed:", message, file=sys.stderr)


def feeder(worker: EngineWorker, sessions: int, stop: threading.Event) -> None:
    rng = np.random.default_rng(0)
    chunks = [(0.1 * rng.standard_normal(1920)).astype(np.float32) for _ in range(32)]
    deadline = time.perf_counter()
    i = 0
    while not stop.is_set():
        for slot in range(sessions):
            worker.push(slot, chunks[(i + slot) % len(chunks)])
        i += 1
        deadline += worker.period_s
        time.sleep(max(0.0, deadline - time.perf_counter()))


def run_segment(worker, loop, sessions, seconds, recorder: Recorder | None) -> dict:
    recordings = []
    for slot in range(sessions):
        recording = None
        if recorder is not None:
            recording = recorder.begin(f"bench_{time.monotonic_ns()}_{slot}", _meta(worker))
            recordings.append(recording)
        worker.open(slot, SlotConfig(), Discard(), loop, recording)
    time.sleep(1.0)  # let the slots open and the inboxes settle before measuring
    worker.tick_ms = TimingRing(size=100_000)
    late_before = worker.late_ticks
    process = psutil.Process()
    cpu_before = process.cpu_times()
    time.sleep(seconds)
    ticks = np.asarray(worker.tick_ms.recent())
    cpu_after = process.cpu_times()
    late = worker.late_ticks - late_before
    closed = threading.Semaphore(0)
    for slot in range(sessions):
        worker.close(slot, closed.release, loop)
    for _ in range(sessions):
        closed.acquire(timeout=10)
    for recording in recordings:
        recording.finish("client_close")
    cpu_s = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {
        "ticks": ticks,
        "late": late,
        "cpu_percent": round(100.0 * cpu_s / seconds, 1),
        "recordings": recordings,
    }


def _meta(worker: EngineWorker) -> dict:
    caps = worker.engine.capabilities
    return {
        "engine": caps.engine,
        "input_rate": caps.input_rate,
        "output_rate": caps.output_rate,
        "chunk_period_ms": caps.chunk_period_ms,
        "input_chunk_samples": caps.input_chunk_samples,
    }


def summarize(ticks: np.ndarray) -> dict:
    return summary(ticks, (50, 90, 99), suffix="_ms", digits=3, count="ticks")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--segment-s", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="a file, or a directory for the named result")
    args = parser.parse_args()
    if not 1 <= args.sessions <= MAX_SESSIONS or not 1 <= args.segment_s <= MAX_SEGMENT_S or not 1 <= args.rounds <= 10:
        parser.error(f"sessions 1..{MAX_SESSIONS}, segment-s 1..{MAX_SEGMENT_S}, rounds 1..10")

    folder = Path(tempfile.mkdtemp(prefix="parley-recorder-bench-"))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="bench-loop", daemon=True).start()
    worker = EngineWorker(EchoEngine(num_slots=args.sessions, delay_frames=3), name="engine-echo-bench")
    worker.start()
    recorder = Recorder(folder)
    recorder.start()
    stop = threading.Event()
    threading.Thread(target=feeder, args=(worker, args.sessions, stop), name="bench-feeder", daemon=True).start()

    off_ticks, on_ticks, segments, recordings = [], [], [], []
    try:
        for round_index in range(args.rounds):
            for recording_on in (False, True):
                result = run_segment(worker, loop, args.sessions, args.segment_s, recorder if recording_on else None)
                (on_ticks if recording_on else off_ticks).append(result["ticks"])
                recordings += result["recordings"]
                seg = {"round": round_index, "recording": recording_on, **summarize(result["ticks"]),
                       "late_ticks": result["late"], "process_cpu_percent": result["cpu_percent"]}  # fmt: skip
                segments.append(seg)
                print(
                    f"round {round_index} recording={'on ' if recording_on else 'off'} "
                    f"p50 {seg['p50_ms']:.3f} ms  p99 {seg['p99_ms']:.3f} ms  late {seg['late_ticks']}  "
                    f"cpu {seg['process_cpu_percent']}%"
                )
        deadline = time.monotonic() + 30
        while recorder.pending and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        worker.stop()
        recorder.stop()
        loop.call_soon_threadsafe(loop.stop)

    off, on = summarize(np.concatenate(off_ticks)), summarize(np.concatenate(on_ticks))
    recorded_minutes = args.sessions * args.rounds * (args.segment_s + 1.0) / 60.0  # the settle second is recorded too
    written = sum(folder_size(folder / r.session_id) for r in recordings)
    dropped = sum(r.dropped_steps + r.dropped_events for r in recordings)
    shutil.rmtree(folder, ignore_errors=True)
    added = round(on["p99_ms"] - off["p99_ms"], 3)
    report = {
        "benchmark": "recorder",
        "engine": "echo",
        "sessions": args.sessions,
        "segment_s": args.segment_s,
        "rounds": args.rounds,
        "tick_without_recording": off,
        "tick_with_recording": on,
        "p99_added_ms": added,
        "p99_budget_ms": BUDGET_MS,
        "within_budget": added <= BUDGET_MS,
        "bytes_per_call_minute": round(written / recorded_minutes),
        "bytes_written": written,
        "dropped_items": dropped,
        "segments": segments,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        },  # fmt: skip
    }
    out = write_result(report, f"recorder-{args.sessions}sessions", out=args.out)
    print(
        f"\n{args.sessions} echo sessions: tick p99 {off['p99_ms']:.3f} ms without recording, "
        f"{on['p99_ms']:.3f} ms with (+{added:.3f} ms, budget {BUDGET_MS} ms); "
        f"{report['bytes_per_call_minute'] / 1e6:.2f} MB per call-minute; {dropped} items dropped -> {out}"
    )
    return 0 if added <= BUDGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
