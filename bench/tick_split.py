"""The tables of a tick-split log (``bench/serving_gpu_service.py --tick-split-log``): per band of live calls, the
worker's tick, Mimi's encode + decode, the LM and the span on the device, and the host's share (the tick less the
device's span), p50 in ms; then least-squares fits of the device's span and the tick over every tick
(a constant + per live call + per 1 000 KV positions).

    python3 bench/tick_split.py bench/results/serving-e2e-lockstep-paged-130-4daphne-hold300s-ticksplit-ticks-h100-69125fd.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys

import numpy as np

BANDS = (0, 20, 40, 60, 80, 100, 120, 140, 160, 200, 240, 330)


def load(path: str) -> dict[str, np.ndarray]:
    opener = gzip.open if path.endswith(".gz") else open
    rows, fields = [], []
    with opener(path, "rt") as f:
        for line in f:
            block = json.loads(line)
            fields, rows = block["fields"], rows + block["ticks"]
    table = np.asarray(rows, dtype=float).reshape(-1, len(fields))
    return {name: table[:, i] for i, name in enumerate(fields)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log")
    t = load(p.parse_args().log)
    live, mimi = t["live"], t["encode_ms"] + t["decode_ms"]
    host = t["tick_ms"] - t["device_span_ms"]
    print(f"{live.size} ticks")
    print(
        "| live calls | ticks | KV positions per call | tick | Mimi encode + decode | LM | device span | tick less device |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for lo, hi in zip(BANDS, BANDS[1:], strict=False):
        band = (live >= lo) & (live < hi)
        if band.sum() < 20:
            continue
        cells = [np.median(x[band]) for x in (t["tick_ms"], mimi, t["lm_ms"], t["device_span_ms"], host)]
        per_call = np.mean(t["context"][band] / np.maximum(live[band], 1))
        print(f"| {lo}-{hi} | {int(band.sum())} | {per_call:.0f} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    some = live > 0
    design = np.c_[np.ones(some.sum()), live[some], t["context"][some] / 1000.0]
    for name in ("device_span_ms", "tick_ms"):
        (const, per_call, per_k), *_ = np.linalg.lstsq(design, t[name][some], rcond=None)
        print(f"{name}: {const:.1f} ms + {per_call * 1000:.1f} us a call + {per_k:.3f} ms per 1000 KV positions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
