"""Callers of whole 80 ms frames through the framer, on a simulated clock, with the arrival jitter of a loaded host.

The 2-core serving runs cannot tell two framer policies apart: the host's speed moves the p99 more from run to run
than a policy does. Here the framer (``inference.audio.framing``, or another commit's copy of it) meets the same
callers every time: ``tests/inference/test_framing.py``'s ``AdvisedCaller`` (whole pieces, quiet or speech with
gaps, following the phase advice or not) at leads spread across the period, each piece late by a draw from a
jitter fitted to what the framer trace measured from send to the inbound lane at 200 lines on 2 cores
(``bench/framer_trace.py``: p50 2.6, p90 15, p99 36 ms): exponential with a 4 ms mean, plus, for 12 % of pieces,
another exponential with a 12 ms mean (p50 3.2, p90 12, p99 34 ms). It prints the share of frames that went a tick
later than their lead (the tick found nothing, or the frame ended a piece back), the mean wait of a frame's end
for its tick, by lead and on average, and the moves a caller made in its call after the first 12 s.

    .venv/bin/python bench/framing_jitter.py [--tree DIR] [--seeds 4] [--jitter independent|bursts] [--out DIR_OR_FILE]

``--tree`` runs another checkout's framer, advice and callers (``git worktree add /tmp/old <commit>``); the result
is named by that checkout's commit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_result  # noqa: E402

LEADS_MS = (10, 20, 30, 45, 60, 75)  # where a caller's pieces land before the tick, spread across the period
TICKS = 1500  # 2 minutes of call
SETTLE_TICKS = 150  # the start and the first moves are left out


def piece_delays(rng: np.random.Generator, count: int, jitter: str = "independent") -> np.ndarray:
    """Each piece's extra delay (s): the trace's send-to-lane spread at 200 lines on 2 cores.

    ``independent``: every piece on its own, as fitted. ``bursts``: the same spread, but the 12 % of pieces that come
    later come in runs of about a second (a window) that share most of their delay, as a web process's loop runs
    late for a while: a calm piece starts a run with probability 0.0114, a run ends after each piece with 1/12, and
    each run draws one extra delay (exponential, 12 ms mean) that all its pieces carry, each with its own 4 ms."""
    delays = rng.exponential(0.004, count)
    if jitter == "independent":
        spiked = rng.random(count) < 0.12
        delays[spiked] += rng.exponential(0.012, spiked.sum())
        return delays
    run_extra = 0.0
    for k in range(count):
        if run_extra:
            delays[k] += run_extra
            if rng.random() < 1 / 12:
                run_extra = 0.0
        elif rng.random() < 0.0114:
            run_extra = rng.exponential(0.012)
            delays[k] += run_extra
    return delays


def run_caller(framing_tests, seed: int, lead_ms: float, follow: bool, audio, jitter: str) -> tuple[float, float, int]:
    """The share of frames that went a tick later, the mean wait of a frame's end for its tick (ms) over the ticks
    that found a frame (what the caller's audio waits in all, beside how often it waits a period more), and the moves
    the caller made after the start (each cuts a piece shorter, padding a take, or longer, leaving audio to trim)."""
    rng = np.random.default_rng(seed)
    late = dict(enumerate(piece_delays(rng, TICKS + 10, jitter)))
    caller = framing_tests.AdvisedCaller(lead_ms / 1000.0, follow=follow, late=late, audio=audio)
    waits = np.array(caller.run(TICKS))[SETTLE_TICKS:]
    moves = sum(1 for tick in caller.move_ticks if tick > SETTLE_TICKS)
    return float(np.mean(np.isnan(waits) | (waits > 80.0))), float(np.nanmean(waits)), moves


def git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, help="another checkout whose framer and callers to run")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--out", type=Path, help="a directory or a file (default bench/results/)")
    p.add_argument("--jitter", choices=("independent", "bursts"), default="independent", help="see piece_delays")
    args = p.parse_args()
    result = {"bench": "framing_jitter", "seeds": args.seeds, "ticks": TICKS, "jitter": args.jitter, "rows": []}
    # The clock is simulated: the result does not depend on this host, and is named by that instead of its cores.
    os.environ.setdefault("BENCH_HARDWARE", "simclock")
    if args.tree:
        sys.path.insert(0, str(args.tree.resolve()))  # its inference/ and tests/ before this checkout's
        os.environ["BENCH_COMMIT"] = git(args.tree, "rev-parse", "--short=7", "HEAD")
        result["tree_dirty"] = bool(git(args.tree, "status", "--porcelain", "--untracked-files=no"))
    import tests.inference.test_framing as framing_tests

    audios = {"quiet": None, "speech": framing_tests.syllables}
    for follow in (False, True):
        for name, audio in audios.items():
            runs = {
                lead: [run_caller(framing_tests, s, lead, follow, audio, args.jitter) for s in range(args.seeds)]
                for lead in LEADS_MS
            }
            by_lead = {lead: float(np.mean([later for later, _, _ in r])) for lead, r in runs.items()}
            wait_by_lead = {lead: round(float(np.mean([wait for _, wait, _ in r])), 1) for lead, r in runs.items()}
            moves = float(np.mean([m for r in runs.values() for _, _, m in r]))
            row = {"callers": "following the advice" if follow else "as they are", "audio": name}
            row |= {"a_tick_later_by_lead_ms": by_lead, "a_tick_later": float(np.mean(list(by_lead.values())))}
            row |= {
                "wait_ms_by_lead_ms": wait_by_lead,
                "wait_ms": round(float(np.mean(list(wait_by_lead.values()))), 1),
                "moves_per_call": round(moves, 2),
            }
            result["rows"].append(row)
            leads = "  ".join(f"{lead}:{share:.3f}/{wait_by_lead[lead]:.0f}" for lead, share in by_lead.items())
            print(
                f"{row['callers']:>21} {name:>6}  a tick later {row['a_tick_later']:.3f}, wait {row['wait_ms']:.1f} ms,"
                f" {moves:.1f} moves"
                f"   by lead (ms: later/wait) {leads}",
                flush=True,
            )
    what = "framing-jitter-whole-frames-sim" + ("" if args.jitter == "independent" else f"-{args.jitter}")
    print(write_result(result, what, out=args.out))


if __name__ == "__main__":
    main()
