#!/usr/bin/env bash
# Issue 15's three calls, on a quiet machine: 60 s browser calls through bench/latency_browser.py, one after the
# other (about 7 minutes in all), each writing bench/results/latency-<engine>[-<label>]-<cores>core-<commit>.json
# with the load average before, during (sampled every 2 s) and after, and printing its per-stage table.
#
#   1. echo at zero delay: mouth-to-ear p50 / p95 (chirps, cross-correlated), underruns over 60 s
#   2. echo with 0-200 ms random delays on the server's outgoing audio for the first 30 s: the
#      degradation, then the recovery (mouth_to_ear_by_10s, page_by_10s)
#   3. the lockstep demo checkpoint (tiny random PersonaPlex of `make run`): the page's measured
#      mouth-to-ear and the time to first agent audio, cold (the first call) and from the prefill cache
#
# Usage: bench/latency_calls.sh
# Nothing else should run meanwhile: every figure here is a timing, and a busy machine shows in the tail.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${LATENCY_SECONDS:-60}"  # a shorter smoke run: LATENCY_SECONDS=10 bench/latency_calls.sh
py=.venv/bin/python
note() { echo "$1; started $(date -u +%H:%MZ) at load $(cut -d' ' -f1-3 /proc/loadavg)"; }

$py bench/latency_browser.py --engine echo --seconds "$seconds" \
  --note "$(note 'echo, zero delay, 60 s')"
$py bench/latency_browser.py --engine echo --seconds "$seconds" --jitter-ms 200 --jitter-seconds "$((seconds / 2))" --label jitter \
  --note "$(note 'echo, 0-200 ms jitter on outgoing audio for the first 30 s of 60 s')"
$py bench/latency_browser.py --engine lockstep --seconds "$seconds" \
  --note "$(note 'lockstep demo checkpoint, 60 s, after a first call that filled the prefill cache')"

$py - <<'PY'
import json
from bench.results_io import result_path
for name in ("latency-echo", "latency-echo-jitter", "latency-lockstep"):
    path = result_path(name)
    r = json.loads(path.read_text())
    m, page, load = r.get("mouth_to_ear") or {}, r["page"], r["host"]["load_avg_1m_during"]
    print(f"{path.name:44s} load {r['host']['load_avg_1m_before']} / {load} | chirps p50 {m.get('p50_ms')} p95 {m.get('p95_ms')}"
          f" | page measured {page['measured_mouth_to_ear_ms']} | underruns {page['underruns']}"
          f" | first audio {page['first_audio_ms']} ms (first call {page['first_audio_ms_first_call']})")
    if "jitter" in name:
        print("   by 10 s:", {k: v["p50"] for k, v in r["mouth_to_ear_by_10s"].items()})
PY
