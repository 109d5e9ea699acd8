"""Unit engine (MiniCPM-o 4.5 duplex) on CPU with the tiny golden checkpoint.

Reports:
1. unit latency of one session: ``UnitEngine.step`` wall time for listen units and speak units (the speak
   units include the TTS; the vocoder is the silent one on CPU);
2. capacity: how many concurrent sessions one model instance serves in turn within the 1 s tick budget
   (p95 of the whole tick over speaking units, i.e. the worst case, must stay under 1000 ms);
4. the native Token2Wav vocoder on tiny random assets: prompt set-up and wall time per 1 s unit (also
   alone: ``--vocoder-only``);
3. memory over N open / prepare / one unit / close cycles: process RSS and Python-heap (tracemalloc off, so
   the run stays fast) before and after, and live session bytes at the end.

The tiny model is random: it speaks on most units after the three forced listens, which is the expensive
case. Timings on a shared 2-core machine are noisy; the numbers say what this host did, not a spec.

Usage::

    .venv/bin/python bench/unit_cpu.py [--cycles 1000] [--max-sessions 8]   (writes bench/results/unit-tiny-<cores>core-<commit>.json)

The same loop runs on a GPU for comparison (``--device cuda --dtype bfloat16``); there the memory section
also reads ``torch.cuda.memory_allocated`` before and after the cycles, which must be equal.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_result  # noqa: E402
from bench.stats import summary  # noqa: E402
from inference.engines.base import SlotConfig, SlotInput, VoiceRef  # noqa: E402
from inference.engines.unit import UnitEngine  # noqa: E402
from inference.models.minicpmo.fill import make_checkpoint  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "minicpmo45"
BUDGET_MS = 1000.0


def _units(audio: np.ndarray, n: int, seed: int) -> list[np.ndarray]:
    """n units: the espeak speech looped, with a little noise so no two units are identical."""
    rng = np.random.default_rng(seed)
    per = audio.shape[0] // 16000
    return [
        audio[(u % per) * 16000 : (u % per + 1) * 16000] + rng.normal(0, 1e-3, 16000).astype(np.float32)
        for u in range(n)
    ]


def _stats(values: list[float]) -> dict:
    return summary(values, (50, 95), suffix="_ms", digits=1, median=True)


def latency(engine: UnitEngine, voice: VoiceRef, audio: np.ndarray, units: int) -> dict:
    engine.open_slot(0, SlotConfig(voice=voice))
    t0 = time.perf_counter()
    engine.step({})
    prepare_ms = (time.perf_counter() - t0) * 1000
    by_decision: dict[str, list[float]] = {"listen": [], "speak": []}
    for chunk in _units(audio, units, seed=1):
        t0 = time.perf_counter()
        out = engine.step({0: SlotInput(audio=chunk)})[0]
        by_decision[out.decision].append((time.perf_counter() - t0) * 1000)
    engine.close_slot(0)
    return {"prepare_ms": round(prepare_ms, 1), **{k: _stats(v) for k, v in by_decision.items()}}


def capacity(engine: UnitEngine, voice: VoiceRef, audio: np.ndarray, max_sessions: int, ticks: int) -> dict:
    rows = []
    fits = 0
    for n in range(1, max_sessions + 1):
        for slot in range(n):
            engine.open_slot(slot, SlotConfig(voice=voice))
        while any(out.prefilling for out in engine.step({}).values()):  # all prepares
            pass
        streams = {slot: _units(audio, ticks, seed=100 + slot) for slot in range(n)}
        tick_ms, speak_ticks = [], []
        for t in range(ticks):
            t0 = time.perf_counter()
            out = engine.step({slot: SlotInput(audio=streams[slot][t]) for slot in range(n)})
            ms = (time.perf_counter() - t0) * 1000
            tick_ms.append(ms)
            if any(o.decision == "speak" for o in out.values()):
                speak_ticks.append(ms)
        for slot in range(n):
            engine.close_slot(slot)
        row = {"sessions": n, "all_ticks": _stats(tick_ms), "speaking_ticks": _stats(speak_ticks)}
        rows.append(row)
        p95 = row["speaking_ticks"].get("p95_ms", row["all_ticks"]["p95_ms"])
        print(f"  {n} sessions: tick p95 {p95} ms", flush=True)
        if p95 <= BUDGET_MS:
            fits = n
        else:
            break
    return {"budget_ms": BUDGET_MS, "max_sessions_within_budget": fits, "rows": rows}


def memory_cycles(engine: UnitEngine, voice: VoiceRef, cycles: int) -> dict:
    proc = psutil.Process()
    unit = SlotInput(audio=np.zeros(16000, np.float32))

    def cycle():
        engine.open_slot(0, SlotConfig(voice=voice))
        engine.step({})
        engine.step({0: unit})
        engine.close_slot(0)

    for _ in range(20):  # allocator and tokenizer caches settle
        cycle()
    gc.collect()
    cuda = engine.device.startswith("cuda")
    cuda_start = torch.cuda.memory_allocated() if cuda else None
    rss_start = proc.memory_info().rss
    samples = []
    t0 = time.perf_counter()
    for i in range(cycles):
        cycle()
        if (i + 1) % max(1, cycles // 10) == 0:
            samples.append(proc.memory_info().rss)
    gc.collect()
    rss_end = proc.memory_info().rss
    cuda_end = torch.cuda.memory_allocated() if cuda else None
    return {
        "cuda_allocated_start_bytes": cuda_start,
        "cuda_allocated_end_bytes": cuda_end,
        "cycles": cycles,
        "seconds": round(time.perf_counter() - t0, 1),
        "rss_start_mb": round(rss_start / 2**20, 2),
        "rss_end_mb": round(rss_end / 2**20, 2),
        "rss_delta_mb": round((rss_end - rss_start) / 2**20, 2),
        "rss_every_tenth_mb": [round(s / 2**20, 2) for s in samples],
        "session_bytes_after": engine.memory_snapshot()["sessions_bytes"],
    }


def model_label(ckpt: Path, engine: UnitEngine, args) -> str:
    """What ran, read from the checkpoint (it said "tiny" whatever it was given)."""
    cfg = json.loads((ckpt / "config.json").read_text())
    params = engine.parts.parameter_bytes() / engine.parts.dtype.itemsize if engine.parts is not None else 0
    source = "generated tiny golden-pack checkpoint (seed 1234)" if not args.checkpoint else f"checkpoint {ckpt.name}"
    return (
        f"MiniCPM-o 4.5 layout, LLM {cfg['hidden_size']} wide x {cfg['num_hidden_layers']} layers, "
        f"{params / 1e9:.3f} B parameters, {source}, {args.dtype} on {args.device}"
    )


def vocoder_speed(device: str, units: int, voice: Path) -> dict:
    """The native Token2Wav on the tiny random assets: prompt set-up, then wall time per 1 s unit (25 codes)."""
    from inference.engines.unit import load_reference_audio
    from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets
    from inference.models.minicpmo.vocoder import Token2WavVocoder

    with tempfile.TemporaryDirectory() as tmp:
        vocoder = Token2WavVocoder(make_token2wav_assets(Path(tmp) / "t2w"), device=device)
        t0 = time.perf_counter()
        state = vocoder.new_state(load_reference_audio(voice))
        prompt_s = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        per_unit = []
        for _ in range(units):
            codes = rng.integers(0, 6561, 25).tolist()
            t0 = time.perf_counter()
            vocoder.synthesize(state, codes, end_of_turn=False)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            per_unit.append((time.perf_counter() - t0) * 1000)
    return {"assets": "tiny random (make_assets)", "prompt_ms": round(prompt_s * 1000, 1), "unit_ms": summary(per_unit)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="a file, or a directory for the named result")
    parser.add_argument("--checkpoint", help="existing tiny checkpoint (default: generate one in a temp dir)")
    parser.add_argument("--units", type=int, default=30, help="units in the single-session latency run")
    parser.add_argument("--ticks", type=int, default=10, help="ticks per capacity step")
    parser.add_argument("--max-sessions", type=int, default=8)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument(
        "--prime-units", type=int, default=0, help="units of a throw-away session run first (GPU: first-seen shapes)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--vocoder-units", type=int, default=20, help="units in the Token2Wav speed run")
    parser.add_argument("--vocoder-only", action="store_true", help="run only the Token2Wav speed section")
    args = parser.parse_args()
    voice_path = DATA / "audio8" / "ref_audio.npy"
    print("vocoder ...", flush=True)
    vocoder = vocoder_speed(args.device, args.vocoder_units, voice_path)
    print(json.dumps(vocoder), flush=True)
    gpu = args.device.startswith("cuda")
    if args.vocoder_only:
        only = {
            "bench": "unit_cpu.vocoder",
            "torch_threads": torch.get_num_threads(),
            "load_avg_at_end": [round(x, 2) for x in psutil.getloadavg()],
            "device": args.device,
            "vocoder": vocoder,
        }
        print(f"wrote {write_result(only, 'token2wav-tiny', gpu=gpu, out=args.out)}")
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(args.checkpoint) if args.checkpoint else make_checkpoint(Path(tmp) / "ckpt", data_dir=DATA)
        engine = UnitEngine(ckpt, num_slots=args.max_sessions, device=args.device, dtype=args.dtype)
        t0 = time.perf_counter()
        engine.warmup()
        warmup_s = time.perf_counter() - t0
        label = model_label(ckpt, engine, args)
        voice = VoiceRef("golden-ref", DATA / "audio8" / "ref_audio.npy")
        audio = np.load(DATA / "turnclose10" / "user_audio.npy")
        if args.prime_units:
            # On a GPU every new cache length is a new kernel shape, and bf16 pays a one-time cost per shape
            # (~0.3 s per unit in a fresh process on the H200); a throw-away call sees them first.
            print(f"priming with {args.prime_units} units ...", flush=True)
            latency(engine, voice, audio, args.prime_units)
        print("latency ...", flush=True)
        lat = latency(engine, voice, audio, args.units)
        print(json.dumps(lat), flush=True)
        print("capacity ...", flush=True)
        cap = capacity(engine, voice, audio, args.max_sessions, args.ticks)
        print(f"memory: {args.cycles} cycles ...", flush=True)
        mem = memory_cycles(engine, voice, args.cycles)
        print(json.dumps(mem), flush=True)
    result = {
        "bench": "unit_cpu",
        "host": {
            "cpus": psutil.cpu_count(),
            "load_avg_at_end": [round(x, 2) for x in psutil.getloadavg()],
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "model": label,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "warmup_s": round(warmup_s, 2),
        "prime_units": args.prime_units,
        "capabilities_extra": dict(engine.capabilities.extra),
        "latency_one_session": lat,
        "capacity": cap,
        "memory_cycles": mem,
        "vocoder": vocoder,
    }
    print(f"wrote {write_result(result, 'unit-tiny', gpu=gpu, out=args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
