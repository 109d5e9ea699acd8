"""The serving path's own numbers: ``LockstepEngine`` (fast backend) under ``EngineWorker`` with N sessions in process.

Three ways of running the same N full-context sessions, so that the serving path's cost over the bare graphed
step can be read off:

- ``served``: the worker thread on its real 80 ms clock (command queue, tick-aligned input framers, engine tick,
  PCM16 encoding, one hand-off per event loop per tick) with N synthetic callers on an asyncio loop in this
  process: each pushes one 80 ms frame of its own audio per period and drains its output through a bounded,
  drop-oldest queue, as a session's outbox does. No web tier, no pool or ``DialogueSession``.
- ``engine``: ``engine.step`` called back to back with ready inputs (the worker's framing and hand-off left out).
- ``bare``: the bench's own loop over the same graphs (``codec.realtime_ticks``): Mimi encode -> graphed step ->
  Mimi decode -> PCM on the host.

Full context: once every session is live (its prefill done through the engine's own path), the slots' pass
counts are moved to ``fill`` and their KV rings hold random data, so each tick reads whole rings as a call that
has run for ``fill`` frames would. (The move is one device write between ticks, in stream order.)
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

import numpy as np
import torch

from bench.lockstep.common import FRAME_MS, log, stats
from inference.engines.base import SlotConfig, SlotInput, SlotOutput
from inference.engines.lockstep import LockstepEngine
from inference.slots.timing import TimingRing
from inference.slots.worker import EngineWorker

FRAME = 1920


def caller_audio(seed: int, frames: int) -> np.ndarray:
    """A caller's voice-like input: a gliding tone plus noise, different for every caller."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames * FRAME) / 24000
    f0 = 120 + 10 * (seed % 11)
    tone = 0.2 * np.sin(2 * np.pi * (f0 + 40 * np.sin(2 * np.pi * 0.5 * t)) * t)
    return (tone + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


class Caller:
    """The asyncio side of one session: a bounded drop-oldest outbox and counters."""

    def __init__(self, outbox_frames: int = 16):
        self.outbox: collections.deque[bytes] = collections.deque(maxlen=outbox_frames)
        self.outputs = 0
        self.audio_frames = 0
        self.live = False
        self.failed: str | None = None
        self.sent = 0

    def slot_output(self, output: SlotOutput, pcm16: bytes, heard_position: int | None) -> None:
        self.outputs += 1
        if not output.prefilling:
            self.live = True
        if pcm16:
            self.audio_frames += 1
            self.outbox.append(pcm16)

    def slot_failed(self, message: str) -> None:
        self.failed = message


def open_all_live(engine: LockstepEngine, n: int, max_ticks: int = 2000) -> int:
    """Open slots 0..n-1 directly on the engine and tick (no live input) until every prefill is done."""
    for s in range(n):
        engine.open_slot(s, SlotConfig())
    ticks = 0
    while any(not engine._slots[s].live for s in range(n)):
        engine.step({})
        ticks += 1
        if ticks > max_ticks:
            raise RuntimeError("prefill did not finish")
    return ticks


def time_engine(engine: LockstepEngine, n: int, ticks: int, set_context: Callable[[], None]) -> dict:
    """``engine.step`` back to back over n live sessions (ready inputs), after their prefill."""
    prefill_ticks = open_all_live(engine, n)
    set_context()
    audio = [caller_audio(100 + s, 8) for s in range(n)]
    inputs = [{s: SlotInput(audio=audio[s][(i % 8) * FRAME : (i % 8 + 1) * FRAME]) for s in range(n)} for i in range(8)]
    for i in range(3):
        engine.step(inputs[i % 8])
    times = []
    for i in range(ticks):
        t = time.perf_counter()
        engine.step(inputs[i % 8])
        times.append((time.perf_counter() - t) * 1e3)
    for s in range(n):
        engine.close_slot(s)
    return stats(times) | {"prefill_ticks": prefill_ticks}


def time_served(
    engine: LockstepEngine, n: int, ticks: int, set_context: Callable[[], None], warm_ticks: int = 25
) -> dict:
    """The worker on its real clock with n in-process callers; tick times as the worker itself records them."""
    worker = EngineWorker(engine, inbox_frames=16, name="bench-worker")
    worker.tick_ms = TimingRing(size=ticks + warm_ticks + 4000)
    step_ms: list[float] = []  # engine.step's own share of each tick, measured inside the worker thread
    engine_step = engine.step

    def timed_step(inputs):
        t = time.perf_counter()
        try:
            return engine_step(inputs)
        finally:
            step_ms.append((time.perf_counter() - t) * 1e3)

    engine.step = timed_step  # type: ignore[method-assign]
    callers = [Caller() for _ in range(n)]
    audio = [caller_audio(1000 + s, 64) for s in range(n)]

    async def run() -> dict:
        loop = asyncio.get_running_loop()
        worker.start()
        for s in range(n):
            worker.open(s, SlotConfig(), callers[s], loop)
        stop = asyncio.Event()

        async def feed() -> None:  # every caller sends one frame per period, on an absolute schedule
            period = FRAME_MS / 1000.0
            start = time.perf_counter()
            k = 0
            while not stop.is_set():
                for s in range(n):
                    i = callers[s].sent % 64
                    worker.push(s, audio[s][i * FRAME : (i + 1) * FRAME])
                    callers[s].sent += 1
                k += 1
                await asyncio.sleep(max(0.0, start + k * period - time.perf_counter()))

        async def drain() -> None:  # the transport side taking audio off each outbox
            while not stop.is_set():
                for c in callers:
                    c.outbox.clear()
                await asyncio.sleep(FRAME_MS / 1000.0)

        tasks = [asyncio.create_task(feed()), asyncio.create_task(drain())]
        t0 = time.perf_counter()
        while not all(c.live for c in callers):
            if any(c.failed for c in callers):
                raise RuntimeError(next(c.failed for c in callers if c.failed))
            if time.perf_counter() - t0 > 120:
                raise RuntimeError("sessions did not go live within 120 s")
            await asyncio.sleep(0.05)
        live_s = time.perf_counter() - t0
        set_context()
        start_ticks = worker.ticks
        await _ticks_reach(worker, start_ticks + warm_ticks)
        ticks0, late0 = worker.ticks, worker.late_ticks
        out0 = [c.audio_frames for c in callers]
        under0 = [worker.slots[s].underruns for s in range(n)]
        wall0 = time.perf_counter()
        await _ticks_reach(worker, ticks0 + ticks)
        ticks1, late1 = worker.ticks, worker.late_ticks
        wall = time.perf_counter() - wall0
        await asyncio.sleep(0.2)  # let the last tick's hand-off arrive
        out1 = [c.audio_frames for c in callers]
        under1 = [worker.slots[s].underruns for s in range(n)]
        stop.set()
        await asyncio.gather(*tasks)
        window = ticks1 - start_ticks
        values = list(worker.tick_ms.recent())[-window:][warm_ticks : warm_ticks + (ticks1 - ticks0)]
        steps = step_ms[-window:][warm_ticks : warm_ticks + (ticks1 - ticks0)]
        worker_only = [t - e for t, e in zip(values, steps, strict=False)]
        per_caller = [b - a for a, b in zip(out0, out1, strict=True)]
        return stats(values) | {
            "engine_step_inside_worker": stats(steps),
            "worker_own_ms": stats(worker_only),
            "ticks_counted": ticks1 - ticks0,
            "late_ticks": late1 - late0,
            "wall_s": round(wall, 2),
            "ticks_per_s": round((ticks1 - ticks0) / wall, 3),
            "audio_frames_per_caller": {"min": min(per_caller), "max": max(per_caller)},
            "input_underruns_per_caller": {"max": max(b - a for a, b in zip(under0, under1, strict=True))},
            "failed": sum(c.failed is not None for c in callers),
            "seconds_to_all_live": round(live_s, 2),
            "realtime": bool(np.percentile(values, 99) <= FRAME_MS) and late1 == late0,
        }

    try:
        return asyncio.run(run())
    finally:
        worker.stop(timeout=10.0)
        del engine.step  # back to the class's method


async def _ticks_reach(worker: EngineWorker, count: int) -> None:
    """Wait until the worker thread has run ``count`` ticks (its counter is all it tells; polling is enough)."""
    while worker.ticks < count:  # noqa: ASYNC110 - the counter lives on another thread, no event to await
        await asyncio.sleep(0.02)


def serving_report(engine: LockstepEngine, n: int, fill: int, ticks: int, engine_ticks: int, fill_rings) -> dict:
    """Engine-only and served runs at n sessions and ``fill`` frames of context, then the bare loop."""
    from bench.lockstep.codec import realtime_ticks

    backend = engine.backend
    ls = backend.lockstep

    def set_context() -> None:
        ls.set_passes(range(n), [fill] * n)

    fill_rings(ls)
    out = {"sessions": n, "fill": fill}
    out["engine"] = time_engine(engine, n, engine_ticks, set_context)
    log(f"   engine.step x{n} at fill {fill}: {out['engine']}")
    out["served"] = time_served(engine, n, ticks, set_context)
    log(f"   served (worker, {n} callers) at fill {fill}: {out['served']}")
    if backend.device.type == "cuda":
        out["bare"] = realtime_ticks(backend.graphed, backend.mimi, n, fill, min(ticks, 300))
        log(f"   bare loop x{n} at fill {fill}: {out['bare']}")
        for key in ("engine", "served"):
            out[f"{key}_over_bare"] = {q: round(out[key][q] / out["bare"][q] - 1.0, 4) for q in ("median", "p99")}
    torch.cuda.synchronize() if backend.device.type == "cuda" else None
    return out
