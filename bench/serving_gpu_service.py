"""The inference service bench/serving_e2e.py drives on the GPU host: ``python -m inference serve``'s service and
socket, but with the engine built from random weights, since the host holds no checkpoint:

- ``--engine lockstep`` (default): as ``bench/lockstep/paged.py`` builds it (PersonaPlex 7B shape, random bf16
  weights made on the GPU, fast path, fp8 KV in a paged pool);
- ``--engine unit``: MiniCPM-o 4.5 at the real shapes as ``bench/unit_gpu.py`` builds it, the fast runner, units
  speaking as in its capacity rows (``bench/serving_unit_engine.py``); ``--vocoder token2wav`` adds random
  Token2Wav assets at the published shapes (default ``none``: silence, as the capacity rows time the unit).

``--memory-log PATH`` writes the service's memory as JSON lines every ``--memory-every`` seconds: RSS and what it
is made of (``/proc/self/smaps_rollup``: anonymous and file-backed), glibc malloc's bytes in use, free in its
arenas and mapped (``mallinfo2``), Python's allocated blocks, the cycle collector's runs by generation (how
many, the longest, objects freed), sessions kept, CUDA memory. That much costs nothing a soak would see.
``--snapshot-at`` seconds after serving starts (comma-separated) adds ``tracemalloc``: the
Python heap in every sample, and at each of those times its largest growths since the first snapshot, by source
line and by call stack. ``tracemalloc`` traces every allocation (the loop runs slower) and a snapshot holds the
interpreter for a second or two, so a run with it measures memory, not latency.

``--switch-intervals-ms 5,0.5`` cycles the interpreter's switch interval (``sys.setswitchinterval``: how long a
thread that wants the GIL waits before it asks the holder to drop it) through those values, ``--switch-window-s``
each, and writes every window's engine ticks (count, p50, p90, p99, over 80 ms) to ``--switch-log``: the engine
thread gives up the GIL in every torch call and its wait for the GPU, and takes it back from an event loop busy
with every caller's socket, so the same calls at the same age tick in windows side by side under each value.
``--tick-split-log PATH`` (lockstep on CUDA) writes where each engine tick went, as JSON lines every 10 s: per
tick the live rows, the pass rows, the KV positions the live calls attend over, the worker's whole tick, the
engine's ``step`` and, from CUDA events around each graph replay, the device time of Mimi's encode, the LM's step
(prefill-only passes included) and Mimi's decode, and the span from the first event to the last. The tick less the
device's span is the host's share: what the service adds to the bare engine at the same calls and ages.
Settings come from the environment as for ``serve`` (``PARLEY_SLOTS``, ``PARLEY_KV_PAGE_FRAMES``,
``PARLEY_KV_MEAN_CALL_S``, ``PARLEY_INFERENCE_TOKEN`` ...); the KV pool is the card's free memory less the
codec's per-slot state and ``--reserve-gib``, as the paged bench sizes it. ``--tiny`` serves the repository's
tiny checkpoint of the engine on the CPU instead (to try the plumbing here).

    python3 bench/serving_gpu_service.py --socket /tmp/x/inference.sock
    python3 bench/serving_gpu_service.py --engine unit --socket /tmp/x/inference.sock   # PARLEY_SLOTS=64
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import os
import signal
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TINY_CHECKPOINT = ROOT / "tests" / "data" / "personaplex" / "ckpt"


def build_engine(config, tmp: Path, args):
    if args.engine == "unit":
        from bench.serving_unit_engine import build_unit_engine

        t0 = time.time()
        engine = build_unit_engine(config.slots, tmp, tiny=args.tiny, vocoder=args.vocoder, context=config.unit_context)
        print(
            f"unit engine warm in {time.time() - t0:.1f} s, vocoder {engine.vocoder.name}, context {engine.context}",
            flush=True,
        )
        return engine
    return build_lockstep(config, tmp, args.reserve_gib, args.tiny)


def build_lockstep(config, tmp: Path, reserve_gib: float, tiny: bool):
    from inference.engines.lockstep import LockstepEngine

    if tiny:
        engine = LockstepEngine(
            TINY_CHECKPOINT, config.slots, device="cpu", dtype="float32", context=config.lockstep_context
        )
        engine.warmup()
        return engine
    import sentencepiece as spm

    from bench.lockstep.against_reference import checkpoint_dir
    from bench.lockstep.codec import build_mimi
    from bench.lockstep.paged import build_native_random, pool_gb_for
    from inference.engines.lockstep_fast_backend import KVPaging

    lm = build_native_random(16, context=config.lockstep_context)
    pool_gb = pool_gb_for(lm, config.slots, reserve_gib)
    paging = KVPaging(
        page_frames=config.kv_page_frames or 128,
        pool_gb=pool_gb,
        mean_call_frames=round(config.kv_mean_call_s * 12.5),
    )
    ckpt = checkpoint_dir(tmp)
    engine = LockstepEngine(
        ckpt,
        config.slots,
        device="cuda",
        dtype="bfloat16",
        kv_fp8=True,
        kv_paging=paging,
        context=config.lockstep_context,
    )
    tokenizer = spm.SentencePieceProcessor(model_file=str(ckpt / "tokenizer.model"))
    t0 = time.time()
    engine.warmup(loaded=(lm, build_mimi(), tokenizer))
    print(f"engine warm in {time.time() - t0:.1f} s, KV pool {pool_gb} GB, pages {paging}", flush=True)
    return engine


def rss_parts_mb() -> dict[str, float]:
    """Resident memory by kind: anonymous (heaps, arenas, tensors) against file-backed (libraries, mapped files)."""
    parts = {}
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("Anonymous", "Rss", "Shared_Clean", "Private_Clean"):
                parts[f"smaps_{name.lower()}_mb"] = round(int(value.split()[0]) / 1024, 1)
    except OSError:
        pass
    return parts


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def malloc_mb() -> dict[str, float]:
    """glibc malloc's own accounting (``mallinfo2``, glibc 2.33+): in use, free inside its arenas (what
    fragmentation keeps resident), and mapped directly for large blocks. Empty where there is no such call."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return {
        "malloc_in_use_mb": round(info.uordblks / 2**20, 1),
        "malloc_free_in_arenas_mb": round(info.fordblks / 2**20, 1),
        "malloc_mapped_mb": round(info.hblkhd / 2**20, 1),
    }


class MemoryLog:
    """The service's memory over a run, from a thread: what a soak's RSS growth is made of."""

    STACK_FRAMES = 8

    def __init__(self, path: Path, every_s: float, snapshot_at: list[float], service) -> None:
        self.path, self.every_s, self.service = path, every_s, service
        self.snapshot_at = sorted(snapshot_at)
        self.first_snapshot: tracemalloc.Snapshot | None = None
        self.t0 = time.monotonic()
        if self.snapshot_at:
            tracemalloc.start(self.STACK_FRAMES)
        # The cycle collector's runs by generation since the last sample: a full one walks every object the
        # service holds, under the GIL the tick needs, and is the only thing that frees a reference cycle.
        self._gc_started = 0.0
        self._gc_runs: dict[int, list[float]] = {}
        self._gc_collected: dict[int, int] = {}
        gc.callbacks.append(self._gc_event)
        threading.Thread(target=self._run, name="memory-log", daemon=True).start()

    def _gc_event(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        generation = info["generation"]
        self._gc_runs.setdefault(generation, []).append((time.perf_counter() - self._gc_started) * 1000)
        self._gc_collected[generation] = self._gc_collected.get(generation, 0) + info["collected"]

    def _gc_since_last(self) -> dict:
        runs, collected = self._gc_runs, self._gc_collected
        self._gc_runs, self._gc_collected = {}, {}
        return {
            f"gc_gen{g}": {"runs": len(ms), "max_ms": round(max(ms), 1), "collected": collected.get(g, 0)}
            for g, ms in sorted(runs.items())
        }

    def _write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def _sample(self) -> dict:
        import psutil

        pool = self.service.pool
        row = {
            "t_s": round(time.monotonic() - self.t0, 1),
            "rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
            **rss_parts_mb(),
            **malloc_mb(),
            "python_blocks": sys.getallocatedblocks(),
            "sessions_kept": len(self.service.sessions),
            "slots_owned": sum(o is not None for o in pool.owners),
            "queued": len(pool.queue),
            "gc_counts": gc.get_count(),
            **self._gc_since_last(),
            "threads": threading.active_count(),
        }
        if tracemalloc.is_tracing():
            heap, heap_peak = tracemalloc.get_traced_memory()
            row |= {"python_heap_mb": round(heap / 2**20, 2), "python_heap_peak_mb": round(heap_peak / 2**20, 2)}
        try:
            import torch

            if torch.cuda.is_available():
                row["cuda_allocated_mb"] = round(torch.cuda.memory_allocated() / 2**20, 1)
                row["cuda_reserved_mb"] = round(torch.cuda.memory_reserved() / 2**20, 1)
        except ImportError:
            pass
        return row

    def _snapshot(self, at_s: float) -> None:
        t0 = time.monotonic()
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        if self.first_snapshot is None:
            self.first_snapshot = snap
            self._write({"snapshot_at_s": at_s, "first": True, "took_s": round(time.monotonic() - t0, 2)})
            return
        by_line = snap.compare_to(self.first_snapshot, "lineno")[:25]
        by_stack = snap.compare_to(self.first_snapshot, "traceback")[:8]
        self._write(
            {
                "snapshot_at_s": at_s,
                "took_s": round(time.monotonic() - t0, 2),
                "growth_by_line": [
                    {"where": str(d.traceback[0]), "kb": round(d.size_diff / 1024, 1), "count": d.count_diff}
                    for d in by_line
                ],
                "growth_by_stack": [
                    {"stack": [str(f) for f in d.traceback], "kb": round(d.size_diff / 1024, 1), "count": d.count_diff}
                    for d in by_stack
                ],
            }
        )

    def _run(self) -> None:
        pending = list(self.snapshot_at)
        next_sample = 0.0
        while True:
            now = time.monotonic() - self.t0
            if pending and now >= pending[0]:
                self._snapshot(pending.pop(0))
            if now >= next_sample:
                self._write(self._sample())
                next_sample = now + self.every_s
            time.sleep(0.5)


class SwitchIntervalCycle:
    """Cycles ``sys.setswitchinterval`` through ``values_ms`` every ``window_s`` and logs each window's ticks."""

    def __init__(self, path: Path, values_ms: list[float], window_s: float, service):
        self.path, self.values_ms, self.window_s, self.service = path, values_ms, window_s, service
        threading.Thread(target=self._run, name="switch-interval-cycle", daemon=True).start()

    def _run(self) -> None:
        import numpy as np

        t0, window = time.monotonic(), 0
        while True:
            value_ms = self.values_ms[window % len(self.values_ms)]
            sys.setswitchinterval(value_ms / 1000.0)
            worker = self.service.worker
            ticks_before = worker.ticks
            started = time.monotonic()
            time.sleep(self.window_s)
            count = worker.ticks - ticks_before
            ticks = np.asarray(worker.tick_ms.recent(count) if count else (), dtype=float)
            row = {"t_s": round(started - t0, 1), "window": window, "switch_interval_ms": value_ms, "ticks": count}
            if ticks.size:
                p50, p90, p99 = np.percentile(ticks, [50, 90, 99])
                row |= {"p50_ms": round(p50, 2), "p90_ms": round(p90, 2), "p99_ms": round(p99, 2)}
                row["over_80ms"] = int((ticks > 80.0).sum())
            row["slots_owned"] = sum(o is not None for o in self.service.pool.owners)
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            window += 1


class TickSplit:
    """Each engine tick split into device and host time (``--tick-split-log``), written every ``every_s``."""

    def __init__(self, path: Path, service, every_s: float = 10.0):
        import torch

        self.path, self.every_s, self.t0 = path, every_s, time.monotonic()
        self._events: list[tuple[str, object, object]] = []
        self._rows: list[list] = []
        self._rows_lock = threading.Lock()
        self._step_ms = 0.0
        self._live = self._pass_rows = self._context = 0
        engine, worker = service.worker.engine, service.worker
        backend = engine.backend
        lockstep = backend.lockstep
        self._window = lockstep.kv.window

        def timed(name: str, fn):
            def run(*args, **kwargs):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = fn(*args, **kwargs)
                end.record()
                if name == "lm":
                    self._pass_rows += int(args[0].shape[0])
                self._events.append((name, start, end))
                return out

            return run

        backend.mimi.encode = timed("encode", backend.mimi.encode)
        backend.mimi.decode = timed("decode", backend.mimi.decode)
        backend.graphed.step = timed("lm", backend.graphed.step)
        engine_step, worker_tick = engine.step, worker._tick

        def step(inputs):
            self._live = len(inputs)
            self._context = sum(min(lockstep.passes[s], self._window) for s in inputs)
            t = time.perf_counter()
            try:
                return engine_step(inputs)
            finally:
                self._step_ms = (time.perf_counter() - t) * 1000.0

        def tick():
            self._events, self._step_ms, self._live, self._pass_rows, self._context = [], 0.0, 0, 0, 0
            t = time.perf_counter()
            worker_tick()
            tick_ms = (time.perf_counter() - t) * 1000.0
            if self._events:
                self._record(tick_ms)

        engine.step, worker._tick = step, tick
        threading.Thread(target=self._flush_every, name="tick-split", daemon=True).start()

    def _record(self, tick_ms: float) -> None:
        device = {"encode": 0.0, "lm": 0.0, "decode": 0.0}
        self._events[-1][2].synchronize()  # the step's copies to the host already waited: this returns at once
        for name, start, end in self._events:
            device[name] += start.elapsed_time(end)
        span = self._events[0][1].elapsed_time(self._events[-1][2])
        row = [
            round(time.monotonic() - self.t0, 3), self._live, self._pass_rows, self._context, round(tick_ms, 2),
            round(self._step_ms, 2), round(span, 2), round(device["encode"], 2), round(device["lm"], 2),
            round(device["decode"], 2),
        ]  # fmt: skip
        with self._rows_lock:
            self._rows.append(row)

    def _flush_every(self) -> None:
        fields = ["t_s", "live", "pass_rows", "context", "tick_ms", "step_ms", "device_span_ms", "encode_ms", "lm_ms",
                  "decode_ms"]  # fmt: skip
        while True:
            time.sleep(self.every_s)
            with self._rows_lock:
                rows, self._rows = self._rows, []
            with self.path.open("a") as f:
                f.write(json.dumps({"fields": fields, "ticks": rows}) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--reserve-gib", type=float, default=7.0)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--engine", choices=("lockstep", "unit"), default="lockstep")
    p.add_argument("--vocoder", choices=("none", "token2wav"), default="none", help="unit engine: its vocoder")
    p.add_argument("--memory-log", type=Path, help="JSON lines of the service's memory over the run")
    p.add_argument("--memory-every", type=float, default=15.0, help="seconds between memory samples")
    p.add_argument(
        "--snapshot-at",
        default="",
        help="comma-separated seconds after serving starts for heap snapshots (the first is the baseline); "
        "turns tracemalloc on",
    )
    p.add_argument(
        "--switch-intervals-ms", default="", help="comma-separated: cycle sys.setswitchinterval through these"
    )
    p.add_argument("--switch-window-s", type=float, default=10.0, help="seconds each switch interval holds")
    p.add_argument("--switch-log", type=Path, help="JSON lines: each switch-interval window's engine ticks")
    p.add_argument("--tick-split-log", type=Path, help="JSON lines: each engine tick's device and host time")
    args = p.parse_args()
    from inference.config import InferenceConfig
    from inference.log_format import configure_logging
    from inference.service import InferenceService
    from inference.transport.server import serve

    config = InferenceConfig.from_env().with_overrides(engine=args.engine)
    configure_logging(json_lines=config.log_json)

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            engine = await asyncio.to_thread(build_engine, config, Path(tmp), args)
            service = InferenceService(config, engine, warmed=True)
            await service.start()
            print(f"serving {args.engine} with {config.slots} slots on {args.socket}", flush=True)
            if args.memory_log:
                at = [float(x) for x in args.snapshot_at.split(",") if x.strip()]
                MemoryLog(args.memory_log, args.memory_every, at, service)
            if args.switch_intervals_ms and args.switch_log:
                values = [float(x) for x in args.switch_intervals_ms.split(",")]
                SwitchIntervalCycle(args.switch_log, values, args.switch_window_s, service)
            if args.tick_split_log and args.engine == "lockstep" and not args.tiny:
                TickSplit(args.tick_split_log, service)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await serve(service, args.socket, stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
