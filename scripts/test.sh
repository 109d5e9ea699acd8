#!/usr/bin/env bash
# The whole test suite, as CI runs it. Browser tests run in their own pytest invocation: once
# pytest-playwright's sync Playwright has started, pytest-asyncio tests in the same process fail.
# pytest's exit code 5 ("no tests collected") counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PYTEST=(.venv/bin/python -m pytest -p no:cacheprovider --durations=10)  # the slowest ten, to see where the time goes
# Deselected, not skipped (under CI a skip fails): GPU tests, and the live NVIDIA/personaplex runs, which need a
# checkout of a repository on no package registry (`make test-reference`); the stored reference data is checked here.
NOT_HERE="not gpu and not personaplex_reference"
status=0
run_suite() {  # name, timeout seconds, pytest args...
  local name=$1 limit=$2; shift 2
  echo "=== $name ==="
  timeout --kill-after=30 "$limit" "${PYTEST[@]}" "$@"
  local rc=$?
  case $rc in
    0) ;;
    5) echo "FAILED: $name collected no tests"; status=1 ;;
    124|137) echo "FAILED: $name timed out after ${limit}s"; status=1 ;;
    *) echo "FAILED: $name (pytest exit $rc)"; status=1 ;;
  esac
}
echo "=== import contracts (lint-imports, .importlinter) ==="
.venv/bin/lint-imports --no-cache || { echo "FAILED: import contracts (lint-imports)"; status=1; }
# The unit/integration tests run as two chains of pytest processes at once, split where the CPU goes: the
# inference tests (model builds and forward passes: CPU-bound) in one; in the other the web tier and SDK tests
# (mostly waiting on sockets, servers and real-time audio; the whole pass in one process: 9m44s wall, 6m52s CPU),
# then the numerical pass below, which is CPU-bound too: run after the inference tests it left one core idle for
# its whole length (on a clean 2-core clone: web tier 631 s beside inference 1 076 s, then numerical 578 s
# alone). Each process has its own test database (settings/test.py names it by pid) and its own throwaway
# services. The second chain's output is printed whole when it ends. The cluster tests (nginx, two daphne, two
# services; heartbeats and placement with 0.5 s deadlines) run alone after both: beside the model tests at load
# 4-5 their heartbeats went stale and calls landed unevenly.
#
# The numerical tests run again on other CPU kernels: MKL's processor-independent code branch and ATen's
# portable (non-SIMD) kernels. Float results differ in their last bits between processors; this pass
# makes a tolerance tuned to one processor's kernels fail here, not on the next machine. It covers every
# model test that compares floats, or tokens computed from them, with stored goldens or a live reference;
# the PersonaPlex wrap packs (minutes each) run in the first pass only. It is split between the two chains so that
# they end together. On a clean 2-core clone, the chains beside each other: tests/inference 351-369 s, then the
# lockstep family's part 84-163 s; the web tier 386-391 s, then MiniCPM-o's 169 s (its fast path's file, ~50 s of
# that, runs in the first chain).
numerical_beside_inference=(tests/inference/models/mimi tests/inference/models/moshi/test_moshi_parity.py
  tests/inference/models/moshi/test_personaplex_golden.py tests/inference/models/moshi/test_lockstep_engine.py
  tests/inference/models/moshi_fast/test_fast_path_cpu.py tests/inference/models/minicpmo/test_fast_path.py)
# MiniCPM-o's chat replies are compared with themselves (the same input, the same reply), not with goldens, and
# on the portable kernels they took 85 s of the pass's 261 s: they run in the first pass only.
numerical_beside_web=(tests/inference/models/minicpmo --ignore=tests/inference/models/minicpmo/test_chat_reply.py
  --ignore=tests/inference/models/minicpmo/test_fast_path.py)
# start_beside runs a command of run_suite calls in the background, its output kept until end_beside waits for it
# and prints it whole (two interleaved pytest outputs are unreadable); its exit code carries the status it set.
beside_log=$(mktemp)
trap 'rm -f "$beside_log"' EXIT
start_beside() { ( status=0; "$@"; exit $status ) >"$beside_log" 2>&1 & beside_pid=$!; }
end_beside() { wait "$beside_pid" || status=1; cat "$beside_log"; }
web_tier_then_unit_numerics() {
  run_suite "unit and integration tests: web tier and SDK (all but tests/inference and tests/cluster)" 1800 \
    -m "not browser and $NOT_HERE" --ignore=tests/inference --ignore=tests/cluster tests "$@"
  MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default \
    run_suite "numerical tests of MiniCPM-o (all but its fast path) on MKL_CBWR=COMPATIBLE, \
ATEN_CPU_CAPABILITY=default" 1200 -m "not browser and $NOT_HERE" "${numerical_beside_web[@]}" "$@"
}
# The guards below are against a hang, not budgets (each test has its own 300 s limit). On a clean 2-core clone the
# passes took: inference 798 s beside the web tier; on a slower one (whose cores gave a load generator twice the
# CPU time for the same work) 1 076-1 355 s, the web tier 630 s to over 900 s (its 900 s guard killed it at 98 %), the
# numerical pass 561-578 s.
start_beside web_tier_then_unit_numerics "$@"
run_suite "unit and integration tests: tests/inference" 1800 -m "not browser and $NOT_HERE" tests/inference "$@"
MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default \
  run_suite "numerical tests of Mimi, Moshi, PersonaPlex, MiniCPM-o's fast path on MKL_CBWR=COMPATIBLE, \
ATEN_CPU_CAPABILITY=default" 600 -m "not browser and $NOT_HERE" "${numerical_beside_inference[@]}" "$@"
echo "=== (waiting for the web-tier tests and the numerical pass, started beside tests/inference; their output follows) ==="
end_beside
run_suite "cluster tests (real topology on loopback)" 600 -m "not browser and $NOT_HERE" tests/cluster "$@"
# The browser tests mostly wait on real-time calls (one file at a time used 0.65 of the 2 cores, 836 s for the 32
# files): they run as two lanes at once, the files dealt between them, each lane one pytest process (each file
# gets its own live servers and chromium: tests/browser/conftest.py). Then the tests marked `solo`, whose bounds
# are latency or underruns on a machine doing nothing else, run alone.
browser_files=(tests/browser/test_*.py) lane_1=() lane_2=()
for i in "${!browser_files[@]}"; do
  if ((i % 2)); then lane_2+=("${browser_files[$i]}"); else lane_1+=("${browser_files[$i]}"); fi
done
not_solo="browser and not solo and $NOT_HERE"
start_beside run_suite "browser tests, lane 2 of 2 (Playwright + Debian chromium)" 1200 -m "$not_solo" \
  "${lane_2[@]}" "$@"
run_suite "browser tests, lane 1 of 2 (Playwright + Debian chromium)" 1200 -m "$not_solo" "${lane_1[@]}" "$@"
echo "=== (waiting for browser lane 2, started beside lane 1; its output follows) ==="
end_beside
run_suite "browser tests marked solo, alone on the machine" 600 -m "browser and solo and $NOT_HERE" tests/browser "$@"
exit $status
