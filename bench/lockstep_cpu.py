"""Lockstep engine on this CPU: 2 concurrent sessions on a tiny checkpoint, and a third session joining.

Creates a tiny random checkpoint (``make-checkpoint``), warms a ``LockstepEngine`` with 3 slots and times
whole engine ticks (Mimi encode -> LM step -> Mimi decode, text detokenisation) as the worker calls them:

1. ``steady``: 2 live sessions, nothing else;
2. ``join``: the same 2 live sessions while a PersonaPlex session joins (voice prompt + persona prefill, which
   rides along the live step and takes extra prefill-only steps within the engine's prefill budget);
3. ``first_audio``: time from a joining session's first appended frame (at its open) to its first agent audio,
   with the prefill cache off (a full prefill) and on (``prefill_cache``: the post-prefill state copied in).

Ticks are paced to the 80 ms clock (as the worker does) so the CPU is not kept artificially hot. Prints a table
and writes ``bench/results/lockstep-<preset>-<cores>core-<commit>.json``.

``--backend eager|fast`` picks the engine's stepper instead of its CPU default (``auto``): the eager
``LockstepGen`` path, or the GPU fast path's objects on CPU (torch twins of its kernels, no graphs); results go to
``bench/results/lockstep-<preset>-<backend>-<cores>core-<commit>.json``.

Usage::

    .venv/bin/python bench/lockstep_cpu.py [--preset tiny-personaplex] [--ticks 250] [--backend eager|fast]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results_io import write_result  # noqa: E402
from bench.stats import summary  # noqa: E402
from inference.engines.base import SlotConfig, SlotInput, VoiceRef  # noqa: E402
from inference.engines.lockstep import LockstepEngine  # noqa: E402
from inference.models.moshi.make_checkpoint import make_checkpoint  # noqa: E402

VOICE = ROOT / "tests" / "data" / "personaplex" / "voice_prompt.pt"  # dim 64, fits the tiny presets
PERIOD_S = 0.080


def percentiles(values: list[float]) -> dict[str, float]:
    return summary(values, (50, 99), suffix="_ms")


def speech_like(seed: int, frames: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(frames * 1920) / 24000
    tone = 0.2 * np.sin(2 * np.pi * (160 + 50 * np.sin(2 * np.pi * 0.5 * t)) * t)
    return (tone + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


def run_ticks(engine, audio, frame, ticks, joiner: int | None, cpu: list[float]) -> tuple[list[float], int, int]:
    """Tick ``ticks`` times with slots 0 and 1 live; returns (tick wall ms, frames consumed, joiner's prefill ticks).

    ``cpu`` receives each tick's process CPU time (ms): on a shared machine wall time also counts the time the
    scheduler gave to other processes, CPU time is the engine's own work.
    """
    times: list[float] = []
    prefill_ticks = 0
    next_at = time.perf_counter()
    for _ in range(ticks):
        inputs = {s: SlotInput(audio=audio[s][frame * 1920 : (frame + 1) * 1920]) for s in (0, 1)}
        started, started_cpu = time.perf_counter(), time.process_time()
        out = engine.step(inputs)
        times.append((time.perf_counter() - started) * 1000.0)
        cpu.append((time.process_time() - started_cpu) * 1000.0)
        if joiner is not None and out.get(joiner) is not None and out[joiner].prefilling:
            prefill_ticks += 1
        frame += 1
        next_at += PERIOD_S
        time.sleep(max(0.0, next_at - time.perf_counter()))
    return times, frame, prefill_ticks


def time_to_first_audio(engine, audio, frame, config) -> tuple[dict, int]:
    """Open slot 2 with ``config`` next to the 2 live sessions; paced ticks until slot 2 returns agent audio.

    Its audio is appended from the open on and fed once the engine says it is live, as the worker does. Returns
    ({ms, ticks}, next frame); slot 2 is closed again.
    """
    started = time.perf_counter()
    engine.open_slot(2, config)
    ticks, next_at, own = 0, started, 0
    while True:
        inputs = {s: SlotInput(audio=audio[s][frame * 1920 : (frame + 1) * 1920]) for s in (0, 1)}
        if engine._slots[2].live:
            inputs[2] = SlotInput(audio=audio[0][own * 1920 : (own + 1) * 1920])
            own += 1
        out = engine.step(inputs)
        ticks += 1
        frame += 1
        if out.get(2) is not None and out[2].audio.size:
            elapsed_ms = (time.perf_counter() - started) * 1000.0
            break
        next_at += PERIOD_S
        time.sleep(max(0.0, next_at - time.perf_counter()))
    engine.close_slot(2)
    return {"ms": elapsed_ms, "ticks": ticks}, frame


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny-personaplex", choices=["tiny-personaplex", "tiny-moshiko"])
    parser.add_argument("--ticks", type=int, default=250, help="measured ticks per phase (80 ms each)")
    parser.add_argument("--backend", default="auto", choices=["auto", "eager", "fast"], help="the engine's stepper")
    parser.add_argument("--out", type=Path, default=None, help="a file, or a directory for the named result")
    args = parser.parse_args()
    suffix = "" if args.backend == "auto" else f"-{args.backend}"

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_checkpoint(args.preset, Path(tmp) / "ckpt", 0)
        engine = LockstepEngine(ckpt, 3, backend=args.backend)
        t0 = time.perf_counter()
        engine.warmup()
        warmup_s = time.perf_counter() - t0
        total = 2 * args.ticks + 400
        audio = {0: speech_like(0, total), 1: speech_like(1, total)}
        for s in (0, 1):
            engine.open_slot(s, SlotConfig(persona="You are a helpful assistant."))
        while any(o.prefilling for o in engine.step({}).values()):
            pass
        frame = 0
        steady_cpu: list[float] = []
        join_cpu: list[float] = []
        _, frame, _ = run_ticks(engine, audio, frame, 20, None, [])  # settle
        load_before = os.getloadavg()[0]
        steady, frame, _ = run_ticks(engine, audio, frame, args.ticks, None, steady_cpu)
        voice = VoiceRef("bench", VOICE) if VOICE.exists() and engine.info.lm.personaplex else None
        engine.open_slot(2, SlotConfig(persona="You are a wise and friendly teacher.", voice=voice))
        join_prefill_total = engine._slots[2].prefill_total
        join, frame, prefill_ticks = run_ticks(engine, audio, frame, args.ticks, 2, join_cpu)
        load_after = os.getloadavg()[0]
        engine.close_slot(2)
        start_config = SlotConfig(persona="You are a patient museum guide.", voice=voice)
        entries, engine.prefill_cache.max_entries = engine.prefill_cache.max_entries, 0
        first_audio_uncached, frame = time_to_first_audio(engine, audio, frame, start_config)
        engine.prefill_cache.max_entries = entries
        _, frame = time_to_first_audio(engine, audio, frame, start_config)  # the first start fills the cache
        first_audio_cached, frame = time_to_first_audio(engine, audio, frame, start_config)

    result = {
        "what": "LockstepEngine ticks, 2 live sessions (+1 joining), tiny random checkpoint, CPU fp32",
        "preset": args.preset,
        "backend": args.backend,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },  # fmt: skip
        "warmup_s": warmup_s,
        "budget_ms": PERIOD_S * 1000,
        "prefill_budget_ms": engine.prefill_budget_ms,
        "cores": os.cpu_count(),
        "load_average_1min": [load_before, load_after],
        "steady_2_sessions": percentiles(steady),
        "join_2_sessions_plus_prefill": percentiles(join),
        "steady_2_sessions_cpu_time": percentiles(steady_cpu),
        "join_2_sessions_plus_prefill_cpu_time": percentiles(join_cpu),
        "join_prefill_frames": join_prefill_total,
        "join_prefill_ticks": prefill_ticks,
        "join_voice_prompt": str(VOICE.name) if voice is not None else None,
        "first_agent_audio_without_prefill_cache": first_audio_uncached,
        "first_agent_audio_with_prefill_cache": first_audio_cached,
    }
    print(f"{'phase':34} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name in ("steady_2_sessions", "join_2_sessions_plus_prefill", "steady_2_sessions_cpu_time",
                 "join_2_sessions_plus_prefill_cpu_time"):  # fmt: skip
        r = result[name]
        print(f"{name:34} {r['n']:5d} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['max_ms']:8.2f}")
    print(f"join: {join_prefill_total} prefill frames done in {prefill_ticks} ticks; budget 80 ms per tick")
    for label, r in (("without", first_audio_uncached), ("with", first_audio_cached)):
        print(f"first agent audio {label} the prefill cache: {r['ms']:.1f} ms ({r['ticks']} ticks)")
    print(f"load average (1 min) before/after: {load_before:.2f} / {load_after:.2f} on {os.cpu_count()} cores")
    print(f"wrote {write_result(result, f'lockstep-{args.preset}{suffix}', out=args.out)}")
    ok = result["steady_2_sessions"]["p99_ms"] < 80 and result["join_2_sessions_plus_prefill"]["p99_ms"] < 80
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
