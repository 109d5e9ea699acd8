"""Mimi's cost when the live calls sit on scattered high slots, with and without moving them to lower codec rows.

What a ramp leaves behind: ``--open`` calls start on slots 0..open-1, then all but ``--keep`` of them end, the
ones kept spread evenly over those slots (the highest among them). The same engine then ticks the kept calls
``--ticks`` times as they are (the codec runs over the prefix that reaches the highest slot), then with
``GraphedMimi.compact`` on: it moves one call a tick until the prefix fits the calls, and the same number of
ticks is timed again. Each tick's Mimi encode + decode and LM step from CUDA events around the graph replays (wall
clock on the CPU), the engine's whole step, and the prefix it ran over; ratios of the two halves at the end. The
calls age between the halves (their KV positions, and the LM's time, grow), so the step is compared less the LM.

On the GPU: the PersonaPlex 7B shape with random bf16 weights, fp8 paged KV, as bench/serving_gpu_service.py
builds it. ``--tiny``: the repository's tiny checkpoint on the CPU, to try it here.

    python3 bench/codec_rows.py --slots 320 --open 229 --keep 130
    .venv/bin/python bench/codec_rows.py --tiny --slots 40 --open 36 --keep 12 --ticks 20
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.lockstep.serving import caller_audio, open_all_live  # noqa: E402
from bench.results_io import write_result  # noqa: E402
from bench.stats import summary  # noqa: E402
from inference.config import InferenceConfig  # noqa: E402
from inference.engines.base import SlotInput  # noqa: E402

FRAME = 1920


class DeviceTimer:
    """Device (CUDA events) or wall time of the named methods' calls, summed per tick."""

    def __init__(self, target, names: tuple[str, ...], device: torch.device):
        self.cuda = device.type == "cuda"
        self.events: list[tuple] = []
        for name in names:
            setattr(target, name, self._timed(getattr(target, name)))

    def _timed(self, fn):
        def run(*args, **kwargs):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = fn(*args, **kwargs)
                end.record()
                self.events.append((start, end))
            else:
                t = time.perf_counter()
                out = fn(*args, **kwargs)
                self.events.append((t, time.perf_counter()))
            return out

        return run

    def take_ms(self) -> float:
        if self.cuda:
            ms = sum(start.elapsed_time(end) for start, end in self.events)  # the step already waited for them
        else:
            ms = sum(end - start for start, end in self.events) * 1e3
        self.events.clear()
        return ms


def build(args):
    from bench.serving_gpu_service import build_lockstep

    config = InferenceConfig(slots=args.slots, kv_page_frames=128, kv_mean_call_s=180.0)
    return build_lockstep(config, Path(tempfile.mkdtemp()), args.reserve_gib, args.tiny)


def time_ticks(engine, timers: dict[str, DeviceTimer], kept: list[int], ticks: int, audio: dict) -> dict:
    """``ticks`` steps of the kept calls: the step's wall time, Mimi's and the LM's time, the KV positions the
    calls attend over (the LM's time grows with them between the two halves; Mimi's does not)."""
    mimi, passes = engine.backend.mimi, engine.backend.lockstep.passes
    times: dict[str, list[float]] = {"step_ms": [], "mimi_ms": [], "lm_ms": []}
    prefixes = []
    positions = sum(passes[s] for s in kept)
    for i in range(ticks):
        inputs = {s: SlotInput(audio=audio[s][(i % 8) * FRAME : (i % 8 + 1) * FRAME]) for s in kept}
        prefixes.append(mimi.prefix_for(max(mimi.row_of[s] for s in kept)))  # the prefix this tick runs over
        t = time.perf_counter()
        engine.step(inputs)
        times["step_ms"].append((time.perf_counter() - t) * 1e3)
        times["mimi_ms"].append(timers["mimi"].take_ms())
        times["lm_ms"].append(timers["lm"].take_ms())
    return {name: summary(values, (50, 90, 99), digits=3) for name, values in times.items()} | {
        "prefix_rows": sorted(set(prefixes)),
        "kv_positions_first_tick": positions,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=320)
    p.add_argument("--open", type=int, default=229, help="calls started on slots 0..open-1")
    p.add_argument("--keep", type=int, default=130, help="calls left, spread evenly over those slots")
    p.add_argument("--ticks", type=int, default=300)
    p.add_argument("--reserve-gib", type=float, default=4.0)
    p.add_argument("--tiny", action="store_true", help="the tiny checkpoint on the CPU")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    engine = build(args)
    mimi = engine.backend.mimi
    timers = {
        "mimi": DeviceTimer(mimi, ("encode", "decode"), mimi.device),
        "lm": DeviceTimer(engine.backend.graphed, ("step",), mimi.device),
    }
    open_all_live(engine, args.open)
    kept = sorted({round(i * (args.open - 1) / (args.keep - 1)) for i in range(args.keep)})
    for s in range(args.open):
        if s not in kept:
            engine.close_slot(s)
    audio = {s: caller_audio(100 + s, 8) for s in kept}
    compact = mimi.compact
    mimi.compact = lambda open_slots: False  # the calls keep their rows
    time_ticks(engine, timers, kept, 5, audio)  # warm
    as_they_are = time_ticks(engine, timers, kept, args.ticks, audio)
    mimi.compact = compact
    while True:  # one move a tick, until a tick moves none
        before = mimi.moves
        engine.step({s: SlotInput(audio=audio[s][:FRAME]) for s in kept})
        for timer in timers.values():
            timer.take_ms()
        if mimi.moves == before:
            break
    moves = mimi.moves
    moved = time_ticks(engine, timers, kept, args.ticks, audio)
    result = {
        "bench": "codec_rows",
        "device": "cpu" if args.tiny else torch.cuda.get_device_name(0),
        "slots": args.slots,
        "opened": args.open,
        "kept": len(kept),
        "highest_kept_slot": kept[-1],
        "moves": moves,
        "as_they_are": as_they_are,
        "moved": moved,
        "ratio_mimi_p50": round(as_they_are["mimi_ms"]["p50"] / moved["mimi_ms"]["p50"], 3),
        "ratio_step_p50": round(as_they_are["step_ms"]["p50"] / moved["step_ms"]["p50"], 3),
        "ratio_step_less_lm_p50": round(
            (as_they_are["step_ms"]["p50"] - as_they_are["lm_ms"]["p50"])
            / (moved["step_ms"]["p50"] - moved["lm_ms"]["p50"]),
            3,
        ),
        "command": " ".join(sys.argv),
    }
    print(result, flush=True)
    what = f"codec-rows-{args.open}-keep{len(kept)}" + ("-tiny" if args.tiny else "")
    print("wrote", write_result(result, what, gpu=not args.tiny, out=args.out))


if __name__ == "__main__":
    main()
