"""Where a traced echo call's delay accumulated, second by second (``bench/latency_browser.py --trace``).

Reads the call's results (page figures once a second, each chirp's time and delay) and the server's
trace (``bench/trace_daphne.py``: every framer push and take, every outbox put and take, on the same
monotonic clock as the page's samples) and prints one row per second of the call:

- ``delay``: the median chirp delay of marks in that second (ms, output latency included);
- ``ctx``: how far the page's audio clock has fallen behind the wall since the first sample (ms: > 0
  means the audio thread lost time, so the microphone delivered, and the speaker played, less);
- ``up``: audio the server's framer received (ms per wall second), ``fifo``: its depth after the
  takes (min / max, ms), ``margin`` (ms at the second's end);
- ``pad`` / ``trim``: silence the framer put in front of short or empty takes, and backlog its trims
  dropped (ms in that second), and ``net``: cumulative pad - trim since the call started (ms): the
  server's contribution to the delay beyond its FIFO;
- ``outq``: the outbox's longest queue; ``buf`` / ``target``: the page's jitter buffer and its target (ms);
  ``under``: page underruns so far; ``*`` after the second: an injected audio stall began (``--stall-audio-ms``);
  ``slipdrop``: audio the page dropped so far for its audio clock's slip (ms).

Usage: .venv/bin/python bench/latency_trace.py bench/results/latency-echo-X.json [trace.jsonl]
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import defaultdict

import numpy as np

RATE = 24_000
FRAME = 1920


def main(argv: list[str]) -> int:
    result = json.loads(open(argv[0]).read())
    trace = result["trace"]
    path = argv[1] if len(argv) > 1 else trace["server"]
    with gzip.open(path, "rt") if str(path).endswith(".gz") else open(path) as lines:
        events = [json.loads(line) for line in lines]
    samples = trace["page_samples"]
    rate = result["context_rate"]
    t0 = samples[0]["monotonic_s"] - 1.0
    # chirp times (context seconds since the tap's start) -> monotonic, through the page's per-second samples
    ctx_s = np.array([(s["context_frames"] - trace["tap_start_frame"]) / rate for s in samples])
    mono = np.array([s["monotonic_s"] for s in samples])
    mark_mono = np.interp(result["mark_times_s"], ctx_s, mono)
    delays: dict[int, list[float]] = defaultdict(list)
    for t, d in zip(mark_mono, result["delays_ms"], strict=True):
        delays[int(t - t0)].append(d)

    rows: dict[int, dict] = defaultdict(lambda: defaultdict(float))
    for e in events:
        sec = int(e["t"] - t0)
        if sec < 0:
            continue
        r = rows[sec]
        if e["k"] == "push":
            r["up"] += e["n"]
        elif e["k"] == "take":
            if e["got"] is None:
                r["pad"] += FRAME if e["mode"] == "aligned" else 0
                r["empty"] += 1
            elif e["short"]:
                r["pad"] += FRAME - e["got"]
                r["short"] += 1
            r["trim"] += e["trimmed"]
            r["fifo_min"] = min(r.get("fifo_min", 1e9), e["after"])
            r["fifo_max"] = max(r.get("fifo_max", 0), e["after"])
            r["margin"] = e["margin_after"]
            r["takes"] += 1
        elif e["k"] == "out_put":
            r["outq"] = max(r.get("outq", 0), e["queued"] + 1)
    page = {int(s["monotonic_s"] - t0): s for s in samples}
    stalled = {int(t - t0) for t in (result.get("audio_stalls") or {}).get("monotonic_s", [])}
    ms = 1000 / RATE
    print(
        f"{'s':>3} {'delay':>6} {'ctx':>5} {'up':>5} {'fifo':>9} {'margin':>6} {'pad':>5} {'trim':>5} {'net':>6}"
        f" {'outq':>4} {'buf':>5} {'target':>6} {'under':>5} {'slipdrop':>8}"
    )
    net = 0.0
    last = None
    for sec in sorted(rows):
        r = rows[sec]
        net += (r["pad"] - r["trim"]) * ms
        p = page.get(sec)
        ctx = ""
        if p and last is None:
            last = p
        elif p and p.get("audioClock") and last.get("audioClock"):  # wall minus audio clock since the first sample
            a, b = last["audioClock"], p["audioClock"]
            ctx = f"{(b['performanceMs'] - a['performanceMs']) - (b['contextMs'] - a['contextMs']):5.0f}"
        elif p:  # runs without the page's clock reading: the tap's frames at each drain (in steps of its blocks)
            wall = p["monotonic_s"] - last["monotonic_s"]
            ctx = f"{1000 * (wall - (p['context_frames'] - last['context_frames']) / rate):5.0f}"
        d = delays.get(sec)
        print(
            f"{sec:3d}{'*' if sec in stalled else ' '}{np.median(d) if d else float('nan'):6.0f} {ctx:>5} {r['up'] * ms:5.0f}"
            f" {r.get('fifo_min', 0) * ms:4.0f}/{r.get('fifo_max', 0) * ms:<4.0f} {r.get('margin', 0) * ms:6.1f}"
            f" {r['pad'] * ms:5.0f} {r['trim'] * ms:5.0f} {net:6.0f} {r.get('outq', 0):4.0f}"
            f" {p['bufferMs'] if p else float('nan'):5.0f} {(p.get('jitter') or {}).get('targetMs', float('nan')) if p else float('nan'):6.0f}"
            f" {p['underruns'] if p else '':>5} {(p.get('jitter') or {}).get('slipDroppedMs', 0) if p else 0:8.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
