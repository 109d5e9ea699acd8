"""Time admission through the real stack: a daphne and a service whose echo engine's tick grows with its calls
(``PARLEY_TEST_ECHO_SLOT_COST_MS``, as a GPU's does), asked for more calls than its time allows. Callers beyond
the engine's time wait in the queue or are refused with the reason, and the calls it holds lose nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOT_COST_MS = 3.0
BUDGET = 0.8  # of the 80 ms period: 64 ms, so about 21 calls at 3 ms each


def test_callers_beyond_the_engines_time_are_queued_or_told_and_the_held_calls_lose_nothing(tmp_path):
    run = subprocess.run(
        [sys.executable, "bench/serving_e2e.py", "--lines", "30", "--ramp-s", "10", "--seconds", "20",
         "--daphnes", "1", "--services", "1", "--env", f"PARLEY_TEST_ECHO_SLOT_COST_MS={SLOT_COST_MS}",
         "--env", f"PARLEY_TICK_BUDGET={BUDGET}", "--recordings-sample", "4", "--render-sample", "0",
         "--env", "PARLEY_WEB_LOOP_LAG_MS=0",  # the engine's admission is under test, not the web process's
         "--out-dir", str(tmp_path), "--what", "over-time"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(next(tmp_path.glob("over-time-*.json")).read_text())
    callers = result["callers"]
    limit = BUDGET * 80.0 / SLOT_COST_MS
    held = [row["slots_held"] for row in result["memory_timeline"]]
    assert held and max(held) <= limit + 2 and min(callers["held_over_hold"]["timeline"]) >= limit - 6, held
    assert callers["calls_queued"] > 0  # the queue took the first callers beyond the limit
    assert callers["calls_failed"] > 0 and all("compute capacity" in why for why in callers["failures"])
    counters = result["service_counters"]
    assert counters["lost_live_frames"] == 0 and result["errors"] == {} and result["internal_error"] == 0
    assert result["recordings"]["raw_complete"] == result["recordings"]["raw_sampled"] == 4
