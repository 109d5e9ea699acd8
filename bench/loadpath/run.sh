#!/bin/bash
# bash .venv-loadpath/run.sh LOGNAME <bench/serving_e2e.py args>: one serving run on the GPU host, its result
# JSON and log under $OUT (the device tool's folder; /tmp/loadpath-out when unset).
source "$(dirname "$0")/env.sh" || exit 1
OUT=${OUT:-/tmp/loadpath-out}; mkdir -p "$OUT"
log=$1; shift
cd "$LOADPATH_SRC" || exit 1
echo "== $(date -u +%T) commit $BENCH_COMMIT: serving_e2e.py $*"
set -o pipefail
${PY:-python3} bench/serving_e2e.py --speech "$SPEECH" --out-dir "$OUT" "$@" 2>&1 | tee "$OUT/$log.log"
