"""Where a live call's input frames wait: the engine's own ticks, the inbound lane and the framer, beside the calls.

For a run of ``bench/serving_e2e.py`` with the in-process echo service (one web process), traced with
``bench/framer_trace/`` and ``--calls-out``:

    PYTHONPATH=bench/framer_trace PARLEY_FRAMER_TRACE_DIR=/tmp/trace .venv/bin/python bench/serving_e2e.py \\
        --lines 200 --ramp-s 30 --seconds 45 --gen-uvloop --calls-out /tmp/trace/calls.npz ...
    .venv/bin/python bench/framer_trace.py /tmp/trace --out bench/results/<name>.json

``serving_e2e`` places each engine tick from the echoes (``serving_analysis.tick_grid``); here the ticks are the
worker's own, so a frame's tick wait and server-added latency are exact, and a frame that went with the tick after
its send is split by where it waited: it reached the inbound lane after its tick (the socket, the event loop), or
before it and the framer kept it back (a whole frame left standing by an earlier take).
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import summary  # noqa: E402

PERIOD_S = 0.080
DELAY_FRAMES = 3  # the echo engine's delay (serving_e2e --delay-frames)
MARK_MOD = 4000  # bench/serving_callers.py
LEAD_BANDS_MS = (0, 5, 10, 15, 20, 30, 80)


def one_file(trace: Path, kind: str) -> np.ndarray:
    files = glob.glob(str(trace / f"{kind}-*.txt"))
    if len(files) != 1:
        raise SystemExit(f"{trace}: expected one {kind}-<pid>.txt (one web process with its service), found {files}")
    return np.loadtxt(files[0], ndmin=2)


def frames_against_ticks(calls, ticks: np.ndarray, lane: np.ndarray) -> dict:
    lane_t, lane_k = lane[:, 0], lane[:, 1].astype(int)
    by_mark = {k: np.sort(lane_t[lane_k == k]) for k in np.unique(lane_k)}
    rows = []  # lead before the tick, send -> lane, reached the lane after the tick, server-added
    for i in range(len(calls["lines"])):
        sent, echoed = calls[f"sent_{i}"], calls[f"echoed_{i}"]
        for k in np.flatnonzero(~np.isnan(sent) & ~np.isnan(echoed)):
            s = sent[k]
            t = np.searchsorted(ticks, s)
            arrivals = by_mark.get(k % MARK_MOD)
            if t >= len(ticks) or arrivals is None:
                continue
            j = np.searchsorted(arrivals, s)
            if j >= len(arrivals) or arrivals[j] - s > 0.2:  # not traced (the last rows of a log are not flushed)
                continue
            tick = ticks[t]
            rows.append((tick - s, arrivals[j] - s, arrivals[j] > tick, echoed[k] - (tick + DELAY_FRAMES * PERIOD_S)))
    r = np.asarray(rows)
    lead, to_lane, after, added = r[:, 0] * 1e3, r[:, 1] * 1e3, r[:, 2] > 0, r[:, 3] * 1e3
    later = added >= PERIOD_S * 1e3
    bands = []
    for lo, hi in zip(LEAD_BANDS_MS[:-1], LEAD_BANDS_MS[1:], strict=True):
        m = (lead >= lo) & (lead < hi)
        bands.append(
            {
                "sent_ms_before_tick": f"{lo}-{hi}",
                "frames": int(m.sum()),
                "a_tick_later": round(float(later[m].mean()), 4) if m.any() else None,
                "reached_lane_after_tick": round(float(after[m].mean()), 4) if m.any() else None,
                "send_to_lane_ms": summary(to_lane[m], (50, 90, 99), digits=2),
            }
        )
    return {
        "frames": int(r.shape[0]),
        "server_added_ms": summary(added, (50, 90, 99), digits=2),
        "tick_wait_ms": summary(lead, (50, 99), digits=2),
        "a_tick_later": round(float(later.mean()), 4),
        "of_those_reached_lane_before_tick": round(float((later & ~after).sum() / max(1, later.sum())), 4),
        "send_to_lane_ms": summary(to_lane, (50, 90, 99), digits=2),
        "by_lead": bands,
    }


def out_path(calls, ticks: np.ndarray, out: np.ndarray, skip_s: float) -> dict:
    """Where a frame's echo waits after its tick: the step, the event loop's wake-up, the delivery, the client.

    Per tick: the step (its start to the hand-off), the loop's wait for the hand-off, the delivery of all the tick's
    outputs. Per frame that made its tick: its echo's tick to the hand-off, to the delivery's start, and to the
    client's receipt (its place in the delivery, the socket and the load generator's loop)."""
    t, kind = out[:, 0], out[:, 1].astype(int)
    handed, began, ended = np.sort(t[kind == 0]), np.sort(t[kind == 1]), np.sort(t[kind == 2])
    n = min(handed.size, began.size, ended.size)
    handed, began, ended = handed[:n], began[:n], ended[:n]
    steady = handed > handed[0] + skip_s
    at = np.clip(np.searchsorted(ticks, handed) - 1, 0, ticks.size - 1)  # the step that handed each tick's outputs
    per_tick = {
        "ticks": int(steady.sum()),
        "step_ms": summary((handed - ticks[at])[steady] * 1e3, (50, 90, 99), digits=2),
        "loop_wait_ms": summary((began - handed)[steady] * 1e3, (50, 90, 99), digits=2),
        "delivery_ms": summary((ended - began)[steady] * 1e3, (50, 90, 99), digits=2),
    }
    rows = []
    for i in range(len(calls["lines"])):
        sent, echoed = calls[f"sent_{i}"], calls[f"echoed_{i}"]
        ok = np.flatnonzero(~np.isnan(sent) & ~np.isnan(echoed))
        k = np.searchsorted(ticks, sent[ok]) + DELAY_FRAMES  # the tick that echoes a frame taken with its own
        keep = k < ticks.size
        ok, k = ok[keep], k[keep]
        tick = ticks[k]
        h = np.searchsorted(handed, tick)
        keep = (h < n) & (echoed[ok] - tick < PERIOD_S)
        ok, tick, h = ok[keep], tick[keep], h[keep]
        keep = handed[h] > handed[0] + skip_s
        ok, tick, h = ok[keep], tick[keep], h[keep]
        rows.append(np.stack([handed[h] - tick, began[h] - handed[h], echoed[ok] - began[h]], axis=1))
    r = np.concatenate(rows) * 1e3
    return {
        "per_tick": per_tick,
        "frames_that_made_their_tick": {
            "frames": int(r.shape[0]),
            "tick_to_hand_off_ms": summary(r[:, 0], (50, 90, 99), digits=2),
            "hand_off_to_delivery_ms": summary(r[:, 1], (50, 90, 99), digits=2),
            "delivery_to_client_ms": summary(r[:, 2], (50, 90, 99), digits=2),
            "tick_to_client_ms": summary(r.sum(axis=1), (50, 90, 99), digits=2),
        },
    }


def takes_summary(takes: np.ndarray, skip_s: float) -> dict:
    t0 = takes[0, 0]
    ids, standing, found = takes[:, 1].astype(np.int64), takes[:, 2], takes[:, 4]
    steady = takes[:, 0] > t0 + skip_s
    whole = standing >= 79.9
    after_empty = 0
    for framer in np.unique(ids):
        m = ids == framer
        w, empty, keep = whole[m], found[m] == -1, steady[m]
        edges = np.diff(np.concatenate([[0], w.astype(int), [0]]))
        for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True):
            if a > 0 and empty[max(0, a - 2) : a].any():
                after_empty += int(keep[a:b].sum())
    n = int(steady.sum())
    return {
        "takes": n,
        "found_nothing": round(float((found[steady] == -1).mean()), 4),
        "short": round(float((found[steady] == 1).mean()), 4),
        "left_a_whole_frame_standing": round(float(whole[steady].mean()), 4),
        "left_part_of_a_frame_standing": round(float(((standing > 1) & ~whole)[steady].mean()), 4),
        "whole_frame_standing_right_after_nothing_found": round(after_empty / max(1, int((whole & steady).sum())), 4),
        "margin_ms": summary(takes[steady, 3], (50, 90, 99), digits=1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", type=Path, help="PARLEY_FRAMER_TRACE_DIR of the run")
    p.add_argument("--calls", type=Path, help="the run's --calls-out (default: TRACE/calls.npz)")
    p.add_argument("--skip-s", type=float, default=35.0, help="takes before this (the ramp) are left out")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    ticks = np.sort(one_file(args.trace, "ticks")[:, 0])
    calls = np.load(args.calls or args.trace / "calls.npz")
    result = {
        "bench": "framer_trace",
        "ticks": {"count": int(ticks.size), "period_ms": summary(np.diff(ticks) * 1e3, (50, 99), digits=2)},
        "frames": frames_against_ticks(calls, ticks, one_file(args.trace, "lane")),
        "takes": takes_summary(one_file(args.trace, "takes"), args.skip_s),
    }
    if glob.glob(str(args.trace / "out-*.txt")):  # traced since the outbound path was
        result["out_path"] = out_path(calls, ticks, one_file(args.trace, "out"), args.skip_s)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
