#!/bin/bash
# Issue 31's GPU soak: the lockstep service (paged KV) behind nginx + 4 daphne, ${LINES:-183} caller lines (183 is
# 80 % of the 229 slots the KV pool admits; 229 lets time admission find the engine's own limit), ramp 30 s + hold
# ${HOLD_S:-450} s (8 minutes of calls). About 580 s of command: run with timeout_s 600. The service's memory log
# (bench/serving_gpu_service.py --memory-log: RSS by kind, malloc's arenas, CUDA) goes to $OUT as
# service-memory.jsonl; MEMORY_LOG=1 adds tracemalloc with heap snapshots at 60 s, mid-hold and the hold's end, and
# "-memlog" to the result's name: the loop runs slower under tracemalloc. RENDER_SAMPLE (default 3) is how many
# sampled recordings are rendered after the hold, each tens of seconds of the command's time. SWITCH_MS=5,0.5 cycles
# the service's switch interval through those values, 10 s each, its windows' ticks in $OUT/switch-interval.jsonl,
# and adds "-switchab" to the result's name (bench/serving_gpu_service.py --switch-intervals-ms). TICK_SPLIT=1 writes
# each engine tick's device and host time to $OUT/tick-split.jsonl and adds "-ticksplit" (--tick-split-log).
# CONTEXT=1500 sets the lockstep engine's context in frames (PARLEY_LOCKSTEP_CONTEXT; default the checkpoint's 3000)
# and adds "-context1500" to the result's name. PROFILE_S=30 (a carry built with PYSPY=1) py-spies the service's threads that long from
# PROFILE_AT_S (default 20) seconds into the hold, then as long again with --gil (who holds the interpreter),
# into $OUT, and adds "-profile" to the result's name.
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader   # HARDWARE=h100 on an H100 (the result's name)
context_tag=
if [ -n "${CONTEXT:-}" ]; then export PARLEY_LOCKSTEP_CONTEXT=$CONTEXT; context_tag="-context$CONTEXT"; fi
lines=${LINES:-183}
arena_tag=${MALLOC_ARENA_MAX:+-arena$MALLOC_ARENA_MAX}   # an allocator setting goes into the name: it changes what RSS shows
hold=${HOLD_S:-450}
# A side-by-side command runs this twice, BEFORE=1 first: each run's logs get names of their own.
run_tag=${BEFORE:+-before}
memlog="--memory-log ${OUT:-/tmp/loadpath-out}/service-memory$run_tag.jsonl --memory-every 15" memlog_tag=
if [ -n "${MEMORY_LOG:-}" ]; then
    memlog_tag=-memlog
    memlog="$memlog --snapshot-at 60,$((hold / 2 + 45)),$((hold + 20))"
fi
switch_tag=
if [ -n "${SWITCH_MS:-}" ]; then
    switch_tag=-switchab
    memlog="$memlog --switch-intervals-ms $SWITCH_MS --switch-window-s 10 --switch-log ${OUT:-/tmp/loadpath-out}/switch-interval$run_tag.jsonl"
fi
split_tag=
if [ -n "${TICK_SPLIT:-}" ]; then
    split_tag=-ticksplit
    memlog="$memlog --tick-split-log ${OUT:-/tmp/loadpath-out}/tick-split$run_tag.jsonl"
fi
profile_args=() profile_tag=
if [ -n "${PROFILE_S:-}" ]; then
    profile_tag=-profile
    profile_args=(--profile-s "$PROFILE_S" --profile-at-s "${PROFILE_AT_S:-20}" --profile-gil)
fi
exec bash "$(dirname "$0")/run.sh" "soak$run_tag" --hardware "${HARDWARE:-h200}" --engine lockstep --services 1 --gpu-service gpu \
    --env PARLEY_SLOTS=320 --env PARLEY_KV_PAGE_FRAMES=128 --env PARLEY_KV_MEAN_CALL_S=180 \
    --lines "$lines" --daphnes 4 --gen-procs 4 --gen-uvloop --ramp-s 30 --seconds "$hold" --service-args "$memlog" \
    "${profile_args[@]}" \
    --what "serving-e2e-lockstep-paged-$lines-4daphne-hold${hold}s$context_tag$arena_tag$memlog_tag$switch_tag$split_tag$profile_tag" --recordings-sample 24 --render-sample "${RENDER_SAMPLE:-3}"
