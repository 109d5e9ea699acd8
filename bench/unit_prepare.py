"""What a new session costs the unit engine's tick: its prepare (the system prompt and voice through the LLM, the
vocoder's prompt), alone and in a burst, with its voice already in use by a live session and with a voice new to
the engine, side by side in one run.

The engine is the one ``bench/serving_gpu_service.py --engine unit`` serves (``bench/serving_unit_engine.py``:
MiniCPM-o 4.5 shapes with random bf16 weights, the fast runner, Token2Wav at the published flow / HiFT sizes). A
prepare is timed as the serving worker runs it, ``open_slot`` then one ``step`` with no units, device synchronised.
Every session has a 2 s voice clip: "in use" is one clip a live session holds, "new" a clip the engine has not
primed (a burst of new voices: a clip each), the cost of every prepare before sessions shared their voice. The parts:
``runner.prepare`` (LLM, the system prompt without a voice), ``prompts.encode`` (S3 tokenizer and speaker
embedding, on the host), ``model.start`` (the flow over the prompt, on the device).

Usage (GPU machine)::

    python3 bench/unit_prepare.py --out $OUT     # $OUT/unit-prepare-<gpu>-<commit>.json (BENCH_COMMIT=...)
    python3 bench/unit_prepare.py --tiny         # the tiny checkpoint on the CPU (smoke)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_io import write_result  # noqa: E402
from bench.serving_unit_engine import build_unit_engine  # noqa: E402
from bench.stats import summary  # noqa: E402
from bench.unit_sessions import timed  # noqa: E402
from inference.contracts import VoiceRef  # noqa: E402
from inference.engines.base import SlotConfig  # noqa: E402
from inference.engines.unit import DEFAULT_SYSTEM_PROMPT  # noqa: E402
from inference.models.minicpmo.vocoder import builtin_prompt  # noqa: E402


def _timed(fn: Callable[[], object], samples: int) -> list[float]:
    """``samples`` runs of ``fn``, each in ms with the device synchronised."""
    return [timed(fn)[1] for _ in range(samples)]


def _ms(times: list[float]) -> dict:
    return summary(times, (50, 99), suffix="_ms", digits=2)


def measure(engine, tmp: Path, samples: int, burst: int, burst_samples: int) -> dict:
    vocoder = engine.vocoder
    clip = builtin_prompt()
    voices = []  # clips of the same length that differ in their samples: other voices to the vocoder
    for k in range(burst + 1):  # 0: the voice in use; 1..burst: new ones
        path = tmp / f"voice-{k}.npy"
        np.save(path, clip * (1.0 - 1e-3 * k))
        voices.append(VoiceRef(f"voice-{k}", path))

    def prepare_ticks(slots: int, *, one_voice: bool) -> Callable[[], None]:
        def run() -> None:
            for slot in range(slots):
                engine.open_slot(slot, SlotConfig(voice=voices[0 if one_voice else slot + 1]))
            engine.step({})  # every prepare in the one tick (prepare_share is lifted below)
            bases = {id(engine._slots[slot].vocoder.base_caches[0]) for slot in range(slots)}
            if len(bases) != (1 if one_voice else slots):
                raise AssertionError(f"{len(bases)} primed voices for {slots} sessions")
            for slot in range(slots):
                engine.close_slot(slot)

        return run

    def shared_ticks(slots: int) -> Callable[[], None]:
        """The burst of new voices under the engine's share of the tick: its ticks, each timed on its own."""

        def run() -> None:
            for slot in range(slots):
                engine.open_slot(slot, SlotConfig(voice=voices[slot + 1]))
            ticks = 0
            while True:
                out, tick_ms = timed(engine.step, {})
                share_ticks.append(tick_ms)
                ticks += 1
                if not any(o.prefilling for o in out.values()):
                    break
            share_tick_counts.append(ticks)
            for slot in range(slots):
                engine.close_slot(slot)

        return run

    keep = vocoder.new_state(np.load(voices[0].path))  # a live session's voice: in use
    features = vocoder.prompts.encode(clip)
    share, engine.prepare_share = engine.prepare_share, float("inf")
    rows = {
        "llm_prepare": _ms(
            _timed(lambda: engine.runner.prepare(engine.runner.new_session(), DEFAULT_SYSTEM_PROMPT, None), samples)
        ),
        "voice_encode_host": _ms(_timed(lambda: vocoder.prompts.encode(clip), samples)),
        "voice_flow_start": _ms(_timed(lambda: vocoder.model.start(features), samples)),
        "prepare_tick_voice_in_use": _ms(_timed(prepare_ticks(1, one_voice=True), samples)),
        "prepare_tick_new_voice": _ms(_timed(prepare_ticks(1, one_voice=False), samples)),
        f"burst_{burst}_voice_in_use": _ms(_timed(prepare_ticks(burst, one_voice=True), burst_samples)),
        f"burst_{burst}_new_voices": _ms(_timed(prepare_ticks(burst, one_voice=False), burst_samples)),
    }
    engine.prepare_share = share
    share_ticks: list[float] = []
    share_tick_counts: list[int] = []
    _timed(shared_ticks(burst), burst_samples)
    rows[f"burst_{burst}_new_voices_with_prepare_share_{share}"] = {
        "tick": _ms(share_ticks),
        "ticks_to_prepare_all": summary(share_tick_counts, (50, 99), count=None),
    }
    del keep
    one_new, one_shared = rows["prepare_tick_new_voice"]["p50_ms"], rows["prepare_tick_voice_in_use"]["p50_ms"]
    rows["ratio_new_over_in_use_p50"] = round(one_new / one_shared, 2)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="the tiny checkpoint on the CPU (smoke)")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--burst", type=int, default=8, help="sessions prepared in one tick")
    parser.add_argument("--burst-samples", type=int, default=40)
    parser.add_argument("--out", help="directory (or file) for the result")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = build_unit_engine(args.burst, Path(tmp), tiny=args.tiny, vocoder="token2wav")
        rows = measure(engine, Path(tmp), args.samples, args.burst, args.burst_samples)
    result = {
        "what": "a new session's prepare in the unit engine's tick: voice in use vs new voice",
        "model": "tiny random checkpoint, CPU" if args.tiny else "MiniCPM-o 4.5 shapes, random bf16, fast runner",
        "vocoder": "token2wav" + ("" if args.tiny else " (published flow / HiFT sizes, random)"),
        "samples": args.samples,
        "burst_samples": args.burst_samples,
        **rows,
    }
    for name, row in rows.items():
        print(f"{name:32s} {row}")
    if not args.tiny:
        print(f"wrote {write_result(result, 'unit-prepare', gpu=True, out=args.out)}")
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
