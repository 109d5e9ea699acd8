"""What the live echo watch costs a call (inference/session/echo_watch.py), on this CPU.

A call of ``--seconds`` is fed through one ``EchoWatch`` at its real sizes: the caller's audio in 20 ms uplink
pieces and the agent's in 80 ms chunks (24 kHz both), playback acks naming each chunk's first and last sample
about twice a second, and a window measured whenever one is due (every ``PERIOD_S``), as the session's
housekeeping does. Reported: the cost per uplink piece and per downlink chunk (the per-frame path: a ring-buffer
copy), what the once-a-second housekeeping holds the event loop for (the window's copy), the CPU per measured
window (on the process's echo thread), and the sum per call-second,
with what that comes to for N calls on one event loop. Times are the thread's CPU time (``time.thread_time``),
not the wall clock: on a host shared with other work the wall clock counts their time too. scipy.signal is
imported first, as the service process already has it (inference/audio/resample.py).

    .venv/bin/python bench/echo_watch_cost.py --seconds 120
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import scipy.signal  # noqa: F401 - loaded in the service already; its import is no window's cost

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_result  # noqa: E402
from inference.session import echo_watch  # noqa: E402

RATE = 24_000
PIECE, CHUNK = 480, 1920
PLAYOUT = 4800  # the agent's audio is heard 200 ms after it is sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    watch = echo_watch.EchoWatch(RATE, RATE)
    rng = np.random.default_rng(0)
    n = int(args.seconds * RATE)
    mic = (rng.normal(0, 0.05, n)).astype(np.float32)
    agent = np.clip(rng.normal(0, 3000, n + CHUNK), -32768, 32767).astype(np.int16)
    piece_s, chunk_s, loop_s = [], [], []
    for start in range(0, n, PIECE):
        t = time.thread_time()
        watch.caller(mic[start : start + PIECE])
        piece_s.append(time.thread_time() - t)
        end = start + PIECE
        if end % CHUNK == 0:
            t = time.thread_time()
            watch.agent(agent[end - CHUNK : end].tobytes())
            chunk_s.append(time.thread_time() - t)
            if end > PLAYOUT + CHUNK:  # one chunk heard in full: its first and last sample
                watch.ack(input_samples=end - CHUNK, client_rate=RATE, output_samples=end - CHUNK - PLAYOUT)
                watch.ack(input_samples=end, client_rate=RATE, output_samples=end - PLAYOUT)
        if end % RATE == 0:  # the session's once-a-second housekeeping
            watch._next_at = 0 if (end // RATE) % int(echo_watch.PERIOD_S) == 0 else float("inf")
            t = time.thread_time()
            watch.measure_if_due()  # on the loop: the window's copy (the maths goes to the echo thread)
            loop_s.append(time.thread_time() - t)
            if watch._pending is not None:
                watch._pending.result()  # a second is far longer than a window takes: done by the next call
    ms = lambda values, q: round(float(np.percentile(np.asarray(values) * 1000, q)), 4)  # noqa: E731
    window_ms = watch.cost_s * 1000 / max(1, watch.windows)  # CPU on the echo thread, per window
    per_call_second_ms = (sum(piece_s) + sum(chunk_s) + sum(loop_s) + watch.cost_s) * 1000 / args.seconds
    result = {
        "seconds": args.seconds,
        "window_s": echo_watch.WINDOW_S,
        "period_s": echo_watch.PERIOD_S,
        "windows": watch.windows,
        "uplink_piece_ms_p50": ms(piece_s, 50),
        "uplink_piece_ms_p99": ms(piece_s, 99),
        "downlink_chunk_ms_p50": ms(chunk_s, 50),
        "loop_housekeeping_ms_p50": ms(loop_s, 50),
        "loop_housekeeping_ms_max": round(max(loop_s) * 1000, 3),
        "window_cpu_ms_mean": round(window_ms, 2),
        "per_call_second_ms": round(per_call_second_ms, 3),
        "share_of_a_core_at_200_calls": round(per_call_second_ms * 200 / 1000, 3),
    }
    print(result)
    print(write_result(result, "echo-watch-cost", out=args.out))


if __name__ == "__main__":
    main()
