"""What ``bench/serving_e2e.py`` makes of a run: the engine's tick grid recovered from the echoes, frames lost
that were sent in time, server-added latency with the tick wait apart, the downlink, recordings, and the
service's own counters (the method is in ``serving_e2e``'s docstring)."""

from __future__ import annotations

import random

import numpy as np

from bench.serving_callers import COUNTERS, FRAME_S, CallRecord
from bench.serving_topology import render_recordings
from bench.stats import summary

SENT_IN_TIME_S = 0.040
PHASE_WINDOW_S = 2.0
PHASE_BIN_S = 0.00025


def tick_grid(sends: np.ndarray, ticks_at_most: np.ndarray, period: float) -> tuple[float, int, int]:
    """The tick phase (mod ``period``) contained in the most intervals [send, recv - delay]; returns
    (phase, intervals containing it, intervals used)."""
    width = ticks_at_most - sends
    ok = (width >= 0) & (width < period)
    lo, width = np.mod(sends[ok], period), width[ok]
    bins = int(round(period / PHASE_BIN_S))
    a = np.floor(lo / PHASE_BIN_S).astype(int) % bins
    b = a + np.ceil(width / PHASE_BIN_S).astype(int)  # inclusive end, may wrap once
    diff = np.zeros(2 * bins + 2, dtype=np.int64)
    np.add.at(diff, a, 1)
    np.add.at(diff, b + 1, -1)
    cover = np.cumsum(diff)[: 2 * bins]
    cover = cover[:bins] + cover[bins:]
    best = cover.max() if cover.size else 0
    if best == 0:
        return float("nan"), 0, int(ok.sum())
    # the middle of the run of best bins (circular)
    idx = np.flatnonzero(cover == best)
    runs = np.split(idx, np.flatnonzero(np.diff(idx) != 1) + 1)
    if len(runs) > 1 and runs[0][0] == 0 and runs[-1][-1] == bins - 1:
        runs[0] = np.concatenate([runs[-1] - bins, runs[0]])
        runs.pop()
    run = max(runs, key=len)
    phase = ((run[0] + run[-1]) / 2.0 + 0.5) * PHASE_BIN_S
    return float(phase % period), int(best), int(ok.sum())


def analyse_echoes(calls: list[CallRecord], delay: int, period: float = FRAME_S) -> dict:
    sends, recvs = [], []
    lost_in_time, sent_in_time, sent_late, unheard_preparing = 0, 0, 0, 0
    per_call_lost = []
    for c in calls:
        if not c.session_id:
            continue
        n = c.frames_sent
        sent = c.sent[:n]
        countable = (np.arange(n) < n - (delay + 2)) & ~np.isnan(sent)  # held back while preparing: not sent
        # generator lateness: sent vs the call's own schedule (its first frame + k * 80 ms, and the phase moves
        # of a caller that follows the advice: a frame cut later moves its send and every later one)
        moved = np.zeros(n)
        for k, shift_s in c.moves:
            moved[k:] += shift_s
        due = sent[0] + np.arange(n) * period + moved if n else sent
        in_time = countable & (sent - due <= SENT_IN_TIME_S)
        echoed = ~np.isnan(c.echoed[:n])
        # Sent before the first session.prefill reached the caller, while the model was already preparing:
        # the service discards these (its prefill_dropped_frames), the model was not listening yet.
        # (No prefill: prefill_noticed_at is 0.0, before every send.)
        preparing = in_time & ~echoed & (sent < c.prefill_noticed_at)
        unheard_preparing += int(preparing.sum())
        lost = in_time & ~echoed & ~preparing
        lost_in_time += int(lost.sum())
        sent_in_time += int(in_time.sum())
        sent_late += int((countable & ~in_time).sum())
        per_call_lost.append(int(lost.sum()))
        sends.append(sent[echoed & countable])
        recvs.append(c.echoed[:n][echoed & countable])
    s = np.concatenate(sends) if sends else np.zeros(0)
    r = np.concatenate(recvs) if recvs else np.zeros(0)
    added, wait, phases = np.zeros(0), np.zeros(0), []
    if s.size:
        order = np.argsort(s)
        s, r = s[order], r[order]
        t0 = s[0]
        window = np.floor((s - t0) / PHASE_WINDOW_S).astype(int)
        edges = np.flatnonzero(np.diff(window)) + 1
        added_parts, wait_parts = [], []
        for ws, wr in zip(np.split(s, edges), np.split(r, edges), strict=True):
            phase, hits, used = tick_grid(ws, wr - delay * period, period)
            phases.append({"phase_ms": round(phase * 1000, 2), "consistent": hits, "of": used})
            if np.isnan(phase):
                continue
            tick_in = ws + np.mod(phase - ws, period)
            wait_parts.append(tick_in - ws)
            added_parts.append(wr - (tick_in + delay * period))
        if added_parts:  # none when no window's echoes fit a grid (a saturated run)
            added, wait = np.concatenate(added_parts) * 1000.0, np.concatenate(wait_parts) * 1000.0
    consistent = sum(p["consistent"] for p in phases)
    used = sum(p["of"] for p in phases)
    # A frame sent moments before a tick reaches the framer after it and goes with the next one: a whole period
    # of server-added latency that comes from the caller's phase against the tick, not from load. Counted
    # apart, so that the tail of the frames that made their tick shows what the stack adds. The grid's phase is the
    # middle of the span every echo allows, so this holds for an engine whose tick is short against the period
    # (the echo engine's few ms); an engine that computes for half the period moves that middle into its compute,
    # and the frames sent in the period's first part would be counted a tick later too.
    later = added >= period * 1000.0
    shifts = [abs(shift_s) * 1000.0 for c in calls for _, shift_s in c.moves]
    return {
        "frames_sent_in_time": sent_in_time,
        "frames_sent_late_by_generator": sent_late,
        "frames_lost_sent_in_time": lost_in_time,
        "frames_unheard_sent_before_prefill_notice": unheard_preparing,
        "calls_with_lost_frames": int(sum(1 for x in per_call_lost if x)),
        "worst_call_lost": max(per_call_lost, default=0),
        "frames_echoed": int(s.size),
        "server_added_ms": summary(added, (50, 90, 99, 99.9), digits=2),
        "tick_wait_ms": summary(wait, (50, 99), digits=2),
        "frames_a_tick_later": round(float(later.mean()), 4) if added.size else None,
        "server_added_made_tick_ms": summary(added[~later], (50, 90, 99, 99.9), digits=2),
        "echo_total_minus_delay_ms": summary((r - s) * 1000.0 - delay * period * 1000.0, (50, 99), digits=2),
        "tick_grid": {
            "windows": len(phases),
            "echoes_consistent_with_grid": round(consistent / used, 4) if used else None,
        },
        # callers that follow the phase advice (--follow-phase): how often and how far they moved their cut
        "phase_moves": {
            "calls_moved": sum(1 for c in calls if c.moves),
            "moves": len(shifts),
            "abs_shift_ms": summary(np.asarray(shifts), (50, 90), digits=1),
        },
    }


def tick_edges(t: np.ndarray, period: float) -> np.ndarray:
    """Each arrival's delay after its tick, for outputs that every tick sends to every live call at once: per
    2 s window the tick grid is the leading edge of the arrivals (mod ``period``: the end of the widest empty
    stretch). Windows with fewer than 50 arrivals are left out."""
    t = np.sort(t)
    window = np.floor((t - t[0]) / PHASE_WINDOW_S).astype(int)
    added = []
    for part in np.split(t, np.flatnonzero(np.diff(window)) + 1):
        if part.size < 50:
            continue
        m = np.sort(np.mod(part, period))
        spans = np.diff(np.concatenate([m, [m[0] + period]]))
        edge = m[(int(np.argmax(spans)) + 1) % m.size]
        added.append(np.mod(part - edge, period))
    return np.concatenate(added) if added else np.zeros(0)


def tick_bursts(t: np.ndarray, period: float) -> tuple[np.ndarray, np.ndarray]:
    """For a slow tick (1 s units): one tick's outputs to every call arrive as one burst, a unit apart. The
    tick's duration varies with what it computed (speaking units cost more), so a fixed grid would count that as
    delay: instead each burst (arrivals closer than a quarter period) is its own tick. Returns each arrival's
    delay after its burst's first arrival, and the bursts' starts."""
    t = np.sort(t)
    cut = np.flatnonzero(np.diff(t) > period / 4) + 1
    bursts = np.split(t, cut)
    return np.concatenate([b - b[0] for b in bursts]), np.array([b[0] for b in bursts])


def analyse_downlink(calls: list[CallRecord]) -> dict:
    """Agent audio as the callers receive it, any engine. Every tick sends one frame to every live call at
    once (a unit engine: a speaking unit's whole second), so ``downlink_added`` is each frame's arrival after
    the arrivals' leading edge (``tick_edges``; a unit engine's: ``tick_bursts``). The gaps between a call's
    frames show whether the 80 ms cadence survives (a unit engine's listen units send nothing: its cadence is in
    ``analyse_units``)."""
    arrivals = [np.asarray(c.audio_arrivals) for c in calls if len(c.audio_arrivals) > 1]
    if not arrivals:
        return {"audio_frames_in": 0}
    period = next(c.period_ms for c in calls if len(c.audio_arrivals) > 1) / 1000.0
    every_tick = period < 0.5  # a frame per tick and call (echo, lockstep); a unit engine's listen units send none
    t = np.concatenate(arrivals)
    d = (tick_edges(t, period) if every_tick else tick_bursts(t, period)[0]) * 1000.0
    out = {
        "audio_frames_in": int(sum(c.audio_frames_in for c in calls)),
        "audio_s_in": round(sum(c.audio_samples_in / c.output_rate for c in calls), 1),
        "downlink_added_ms": summary(d, (50, 99, 99.9), digits=2),
    }
    if every_tick:
        out["note"] = "downlink_added wraps at 80 ms: a frame a whole tick late reads as early"
        gaps = np.concatenate([np.diff(a) for a in arrivals])
        out["gap_minus_80ms_ms"] = summary((gaps - period) * 1000.0, (50, 99, 99.9), digits=2)
    return out


def analyse_units(calls: list[CallRecord]) -> dict:
    """A unit engine's units as the callers saw them: one decision (``response.listen`` / ``.speak``) per unit
    and call, all of a tick's at once. ``decision_added`` is each decision's arrival after the first of its
    tick's (``tick_bursts``: the web tier's spread over the calls); ``ticks_apart_minus_unit`` is the bursts'
    spacing less the unit (the engine's tick as the callers see it: late ticks come further apart); the gaps
    between one call's decisions minus the unit show whether its 1 s cadence survives; units decided per second
    of the call's audio show input the engine never turned into a unit (the prepare tick and the unit in flight
    at the close make it a little under 1)."""
    timed = [c for c in calls if c.session_id and len(c.decisions_at) > 1]
    if not timed:
        return {"units_decided": 0}
    period = timed[0].period_ms / 1000.0
    arrivals = [np.asarray(c.decisions_at) for c in timed]
    gaps = np.concatenate([np.diff(a) for a in arrivals])
    added, starts = tick_bursts(np.concatenate(arrivals), period)
    decided = sum(len(c.decisions_at) for c in timed)
    per_audio_s = [len(c.decisions_at) / call_audio_s(c) for c in timed]
    return {
        "unit_ms": round(period * 1000.0, 1),
        "units_decided": decided,
        "units_spoken": int(sum(c.units_spoken for c in timed)),
        "speaking_fraction": round(sum(c.units_spoken for c in timed) / decided, 3),
        "decision_added_ms": summary(added * 1000.0, (50, 99, 99.9), digits=2),
        "ticks_apart_minus_unit_ms": summary((np.diff(starts) - period) * 1000.0, (1, 50, 99), digits=2),
        "gap_minus_unit_ms": summary((gaps - period) * 1000.0, (50, 99, 99.9), digits=2),
        "units_per_call_audio_s": summary(per_audio_s, (1, 50), digits=3),
    }


def analyse_recordings(calls: list[CallRecord], topo, sample: int, render: int, seed: int) -> dict:
    """Raw recordings of a random sample of the ended calls: finished, and their duration against the call's
    audio (first frame sent to last, plus one); then a smaller sample post-processed as Celery would."""
    from inference.recording.chunks import session_folder
    from inference.recording.reader import read_recording

    ended = [c for c in calls if c.session_id and not c.failed and c.frames_sent]
    picked = random.Random(seed).sample(ended, min(sample, len(ended)))
    finished, complete, ratios, problems = 0, 0, [], []
    for c in picked:
        try:
            rec = read_recording(session_folder(topo.recordings_dir, c.session_id))
        except Exception as exc:  # noqa: BLE001 - a recording that cannot be read is counted as incomplete
            problems.append(f"{c.session_id}: {type(exc).__name__}: {exc}"[:200])
            continue
        audio_s = call_audio_s(c)
        ratio = rec.duration_s / audio_s
        ratios.append(ratio)
        finished += rec.finished
        complete += rec.finished and ratio >= 0.95
    rendered = render_recordings(topo.var_dir, topo.env, [c.session_id for c in picked[:render]]) if render else {}
    statuses: dict[str, int] = {}
    for row in rendered.values():
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return {
        "calls_ended": len(ended),
        "raw_sampled": len(picked),
        "raw_finished": finished,
        "raw_complete": complete,
        "raw_duration_over_call_audio": summary(ratios, (1, 50), digits=3),
        "rendered": len(rendered),
        "rendered_status": statuses,
        "rendered_not_ready": {k: v for k, v in rendered.items() if v["status"] != "ready"},
        "problems": problems[:10],
    }


def calls_held(calls: list[CallRecord], start: float, end: float, step_s: float = 10.0) -> dict:
    """Calls in progress (admitted and not yet closed) every ``step_s`` over [start, end] (perf_counter, which
    every process of the run shares): when admission refuses, fewer calls are held than there are lines."""
    opened = np.array([c.opened_at for c in calls if c.session_id], dtype=float)
    closed = np.array([c.closed_at or end for c in calls if c.session_id], dtype=float)  # 0: still open
    times = np.arange(start, end + 1e-9, step_s)
    held = [int(((opened <= t) & (closed > t)).sum()) for t in times]
    return {"step_s": step_s, "timeline": held, "mean": round(float(np.mean(held)), 1) if held else None}


def engine_tick(calls: list[CallRecord]) -> dict:
    p50 = [c.last_metrics["tick_ms_p50"] for c in calls if "tick_ms_p50" in c.last_metrics]
    p99 = [c.last_metrics["tick_ms_p99"] for c in calls if "tick_ms_p99" in c.last_metrics]
    late = [c.last_metrics.get("late_ticks", 0) for c in calls if c.last_metrics]
    return {
        "period_ms": next((c.period_ms for c in calls if c.session_id), None),
        "tick_ms_p50_median_of_calls": round(float(np.median(p50)), 2) if p50 else None,
        "tick_ms_p99_worst_call": round(float(max(p99)), 2) if p99 else None,
        "late_ticks_max": int(max(late)) if late else None,
    }


def call_audio_s(c: CallRecord) -> float:
    """The call's audio timeline: its first frame sent to its last (frames held back in between included)."""
    sent = c.sent[: c.frames_sent]
    return float(np.nanmax(sent) - sent[0] + FRAME_S)


def service_counters(calls: list[CallRecord]) -> dict:
    """The service's own counts (each call's last ``session.metrics``, cumulative per slot): frames dropped in
    all, of which quiet audio trimmed by the framer (standing depth) and audio sent while the model prepared;
    ticks that found no new input (underruns). ``lost_live_frames`` is the rest of the drops: audio the
    model should have heard. ``frames_held_preparing`` is the callers' side: frames not sent while preparing."""
    out = {name: int(sum(c.counters.get(name, 0) for c in calls)) for name in COUNTERS}
    out["lost_live_frames"] = out["dropped_frames"] - out["trimmed_frames"] - out["prefill_dropped_frames"]
    out["frames_held_preparing"] = int(sum(c.frames_held for c in calls))
    out["in_wait_ms_max_worst_call"] = round(max((c.in_wait_ms_max for c in calls), default=0.0), 1)
    out["out_wait_ms_max_worst_call"] = round(max((c.out_wait_ms_max for c in calls), default=0.0), 1)
    return out
