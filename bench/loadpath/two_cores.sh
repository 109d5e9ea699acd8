#!/bin/bash
# The 2-core goal at the current code: everything (load generator included) on cores 0-1, echo engine in one
# daphne, 200 caller lines, ramp 30 s + hold 45 s, as serving-e2e-echo-1daphne-200-h200host-2cores-664bff0.json.
exec taskset -c 0,1 bash "$(dirname "$0")/run.sh" two-cores --hardware h200host-2cores \
    --what serving-e2e-echo-1daphne-200 --lines 200 --ramp-s 30 --seconds 45 --gen-uvloop
