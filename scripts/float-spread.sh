#!/usr/bin/env bash
# Measure how far the numerical tests' float results move across CPU code paths, to choose their
# tolerances from (see tests/float_spread.py). Runs the given tests (default: tests/inference/models)
# once per code path this processor supports, with every float assertion recording instead of
# raising, then prints the largest differences per assertion and per code path.
#   scripts/float-spread.sh OUT_DIR [pytest args...]
# JOBS=N runs N code paths at once (each with THREADS torch threads, default 2 as on CI's machines);
# PYTHON picks the interpreter (default .venv/bin/python); ONLY="default second-pass" runs just those.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/float-spread.sh OUT_DIR [pytest args...]}
shift
[[ $# -gt 0 ]] || set -- tests/inference/models
python=${PYTHON:-.venv/bin/python}
mkdir -p "$out"

has() { grep -qw "$1" /proc/cpuinfo; }
paths=(
  "default="
  # What scripts/test.sh's second pass runs.
  "second-pass=MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default"
  "mkl-compatible=MKL_CBWR=COMPATIBLE"
  "aten-default=ATEN_CPU_CAPABILITY=default"
  "onednn-sse41=ONEDNN_MAX_CPU_ISA=SSE41"
  "threads-1=OMP_NUM_THREADS=1"
  "threads-8=OMP_NUM_THREADS=8"
  "mkl-sse4_2=MKL_CBWR=SSE4_2"
  "mkl-avx=MKL_CBWR=AVX"
  "mkl-enable-avx=MKL_ENABLE_INSTRUCTIONS=AVX"
)
if has avx2; then paths+=("mkl-avx2=MKL_CBWR=AVX2" "aten-avx2=ATEN_CPU_CAPABILITY=avx2"); fi
if has avx512f; then paths+=("mkl-avx512=MKL_CBWR=AVX512" "aten-avx512=ATEN_CPU_CAPABILITY=avx512"); fi

run() {  # name, "VAR=value ..."
  local name=$1 settings=$2
  shift 2
  echo "=== $name: ${settings:-(no overrides)}"
  # shellcheck disable=SC2086  # settings is a list of VAR=value words
  env OMP_NUM_THREADS="${THREADS:-2}" $settings PARLEY_FLOAT_SPREAD_OUT="$out/$name.json" \
    PARLEY_FLOAT_SPREAD_RECORD_ONLY=1 "$python" -m pytest -p no:cacheprovider -p tests.float_spread -q "$@" \
    >"$out/$name.log" 2>&1
  echo "--- $name: $(tail -1 "$out/$name.log")"
}
for entry in "${paths[@]}"; do
  [[ -z ${ONLY:-} || " $ONLY " == *" ${entry%%=*} "* ]] || continue
  run "${entry%%=*}" "${entry#*=}" "$@" &
  while [[ $(jobs -rp | wc -l) -ge ${JOBS:-1} ]]; do wait -n; done
done
wait
"$python" -m tests.float_spread report "$out"/*.json | tee "$out/report.txt"
