"""How long a standing backlog waits in the load bench's speech before the framer may cut it.

The framer (``inference.audio.framing``) trims only quiet audio. Cut as one piece, a backlog of ``--backlog-ms``
waits for a pause at least that long at the head of the FIFO; cut through the quiet ``GAP_BLOCK_MS`` blocks inside
speech, it waits until that much of them has passed. From 500 random instants of ``bench/serving_e2e.py``'s speech
(espeak-ng, 25 s, looped), this prints both waits' p50 / p90 / p99. No timing of code: a property of the speech.

Usage::

    .venv/bin/python bench/speech_gaps.py [--backlog-ms 75]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving_e2e import make_speech  # noqa: E402

from inference.audio.quiet_gaps import GAP_BLOCK_MS, QUIET_RMS, quiet_blocks  # noqa: E402

RATE = 24_000


def waits_ms(quiet: np.ndarray, need: int, block_ms: float, starts: list[int]) -> dict[str, float]:
    """From each start block, how long until ``need`` quiet blocks have passed: in a row, and in all."""
    looped = np.concatenate((quiet, quiet, quiet))  # the callers loop the speech
    runs = np.flatnonzero(np.convolve(looped.astype(int), np.ones(need, int), "valid") == need) + need
    passed = np.cumsum(looped)
    in_a_row, in_all = [], []
    for start in starts:
        in_a_row.append((runs[np.searchsorted(runs, start + need)] - start) * block_ms)
        in_all.append((np.searchsorted(passed, passed[start] + need) + 1 - start) * block_ms)
    pct = lambda v: {f"p{q}": round(float(np.percentile(v, q))) for q in (50, 90, 99)}  # noqa: E731
    return {"a pause as long as the backlog": pct(in_a_row), "gaps inside speech": pct(in_all)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog-ms", type=float, default=75.0, help="an 80 ms frame less the 5 ms margin floor")
    parser.add_argument("--speech", default="", help="a cached .npy of pcm16 24 kHz speech (made when absent)")
    args = parser.parse_args()
    path = Path(args.speech) if args.speech else Path(tempfile.mkdtemp(prefix="parley-speech-")) / "speech.npy"
    speech = make_speech(path).astype(np.float32) / 32768.0
    block = int(RATE * GAP_BLOCK_MS / 1000)
    quiet = np.zeros(len(speech) // block, dtype=bool)
    quiet[quiet_blocks(speech, block, QUIET_RMS)] = True  # the framer's own test
    need = int(np.ceil(args.backlog_ms / GAP_BLOCK_MS))
    starts = random.Random(0).sample(range(len(quiet)), 500)
    print(f"speech {len(speech) / RATE:.1f} s, {quiet.mean():.1%} of its {GAP_BLOCK_MS:g} ms blocks quiet")
    for kind, waits in waits_ms(quiet, need, GAP_BLOCK_MS, starts).items():
        print(f"{args.backlog_ms:g} ms backlog, cut through {kind}: waits {waits} ms")


if __name__ == "__main__":
    main()
