#!/bin/bash
# Issue 31's unit-engine run: MiniCPM-o 4.5 shapes (random bf16 weights) behind nginx + 2 daphne, 64 caller lines
# on 64 slots (the warm-up session takes a 65th, as in the capacity rows), ramp 30 s + hold ${HOLD_S:-180} s; about
# 7 minutes of command: run with timeout_s 600. VOCODER=token2wav adds the vocoder (needs onnx + onnxruntime).
# bench/notes/serving-e2e.md, section 3, says what it reads. CONTEXT=4096 sets the engine's LLM positions per call
# (PARLEY_UNIT_CONTEXT; default 8192) and names the result after it.
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
vocoder=${VOCODER:-none}
context_tag=""
if [ -n "${CONTEXT:-}" ]; then export PARLEY_UNIT_CONTEXT=$CONTEXT; context_tag="-context$CONTEXT"; fi
# The engine's tokenizer is in the checkout the device got, beside this folder; the code runs from LOADPATH_SRC.
source "$(dirname "$0")/env.sh" || exit 1
mkdir -p "$LOADPATH_SRC/tests/data" && cp -r "$(dirname "$0")/../tests/data/minicpmo45" "$LOADPATH_SRC/tests/data/"
exec bash "$(dirname "$0")/run.sh" unit --hardware h200 --services 1 --gpu-service unit --vocoder "$vocoder" \
    --slots "${SLOTS:-64}" --lines "${SLOTS:-64}" --daphnes 2 --gen-procs 2 --gen-uvloop --ramp-s 30 \
    --seconds "${HOLD_S:-180}" --what "serving-e2e-unit-${SLOTS:-64}-2daphne-vocoder-$vocoder$context_tag" \
    --recordings-sample 24 --render-sample 3
