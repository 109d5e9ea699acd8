"""Serving under load, end to end: real callers against [nginx ->] N daphne -> the inference service(s).

The load generator (``bench/serving_callers.py``) runs caller lines in ``--gen-procs`` processes: real
speech (espeak-ng, resampled to 24 kHz) in paced 80 ms binary frames, playback acks as the call page sends
them, call lengths drawn from the 3-minute mix (a line hangs up and calls again), connects ramped over
``--ramp-s``. The topology (``bench/serving_topology.py``) is started on loopback for the run.

What it reports (JSON in ``bench/results/<what>-<hardware>-<commit>.json``, through ``bench/results_io.py``):

- frames lost that were sent in time: frames the generator sent within 40 ms of their due time whose echo
  never came (echo engine), per caller and in all; the service's own drop counters beside;
- server-added latency p50 / p99 with the engine's tick wait taken out, and the tick wait beside. All
  processes share one monotonic clock, so the engine's tick grid is recovered from the echoes themselves:
  each echo of frame k proves a tick in [send(k), recv(k) - delay * 80 ms]; per 2 s window, the phase that
  every such interval contains is the grid (good to ~1 ms on loopback). Then
  ``tick wait = first tick at or after send(k) - send(k)`` and
  ``server-added = recv(k) - (that tick + delay * 80 ms)``: a frame that reached the engine too late for
  the tick after it was sent costs the whole 80 ms, as it does for the caller;
- ``internal_error`` (and every other error code) counted from the callers' sockets, and error lines of the
  processes' logs;
- recordings complete: finished, with a duration within 5 % of the call's audio;
- calls per CPU core per process kind (daphne, service, nginx, load generator) over the hold, and the
  engine's own tick (``session.metrics``) in the same run; RSS per kind (and GPU memory) every 10 s.

Usage (loopback only)::

    .venv/bin/python bench/serving_e2e.py --lines 200 --seconds 60 --what echo-1daphne --hardware 2core
    python3 bench/serving_e2e.py --engine lockstep --services 1 --daphnes 4 --lines 229 ...
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import results_io  # noqa: E402
from bench.serving_callers import FRAME_S, CallRecord, caller_line  # noqa: E402
from bench.serving_topology import cpu_seconds, error_lines, render_recordings, rss_mb, start_topology  # noqa: E402
from bench.stats import summary  # noqa: E402

SENT_IN_TIME_S = 0.040
PHASE_WINDOW_S = 2.0
PHASE_BIN_S = 0.00025
SENTENCES = (
    "Hello, I would like to book a table for four people on Friday evening, around seven if you can.",
    "Could you tell me whether the train to the airport still leaves from platform nine in the morning?",
    "I have been thinking about the garden, and I believe the roses need more sun than they get now.",
    "The meeting moved to Tuesday, so we have two more days to finish the report and check the numbers.",
)


def make_speech(path: Path) -> np.ndarray:
    """About 25 s of espeak-ng speech as pcm16 at 24 kHz (cached in ``path``)."""
    if path.exists():
        return np.load(path)
    pieces = []
    for i, text in enumerate(SENTENCES):
        wav = path.with_suffix(f".{i}.wav")
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(wav), text], check=True)
        data = np.frombuffer(wav.read_bytes()[44:], dtype="<i2").astype(np.float32)  # 22050 Hz mono
        wav.unlink()
        t_out = np.arange(int(len(data) * 24000 / 22050)) / 24000.0
        pieces.append(np.interp(t_out, np.arange(len(data)) / 22050.0, data))
        pieces.append(np.zeros(12000))  # half a second between sentences
    speech = np.clip(np.concatenate(pieces), -32000, 32000).astype("<i2")
    np.save(path, speech)
    return speech


# ---- the load generator's processes ---------------------------------------------------------------


def _generator(args_dict: dict, lines: list[int], keys: list[str], url: str, t0: float, until: float, out) -> None:
    if args_dict.get("gen_uvloop"):
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
    speech = np.load(args_dict["speech"])
    calls: list[CallRecord] = []
    n = args_dict["lines"]

    async def main() -> None:
        await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        await asyncio.gather(
            *(
                caller_line(
                    i,
                    url,
                    keys[i],
                    i * args_dict["ramp_s"] / n,
                    until,
                    args_dict["mean_call_s"],
                    args_dict["max_call_s"],
                    speech,
                    calls,
                    seed=args_dict["seed"] * 100003 + i,
                )
                for i in lines
            )
        )

    asyncio.run(main())
    for c in calls:
        c.audio_arrivals = np.asarray(c.audio_arrivals, dtype=np.float64)
        c.tail = np.zeros(0, dtype=np.int32)
    out.put(calls)


# ---- analysis -------------------------------------------------------------------------------------


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
    lost_in_time, sent_in_time, sent_late = 0, 0, 0
    per_call_lost = []
    for c in calls:
        if not c.session_id:
            continue
        n = c.frames_sent
        sent = c.sent[:n]
        countable = np.arange(n) < n - (delay + 2)
        # generator lateness: sent vs the call's own schedule (its first frame + k * 80 ms)
        due = sent[0] + np.arange(n) * period if n else sent
        in_time = countable & (sent - due <= SENT_IN_TIME_S)
        echoed = ~np.isnan(c.echoed[:n])
        lost = in_time & ~echoed
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
        added, wait = np.concatenate(added_parts) * 1000.0, np.concatenate(wait_parts) * 1000.0
    consistent = sum(p["consistent"] for p in phases)
    used = sum(p["of"] for p in phases)
    return {
        "frames_sent_in_time": sent_in_time,
        "frames_sent_late_by_generator": sent_late,
        "frames_lost_sent_in_time": lost_in_time,
        "calls_with_lost_frames": int(sum(1 for x in per_call_lost if x)),
        "worst_call_lost": max(per_call_lost, default=0),
        "frames_echoed": int(s.size),
        "server_added_ms": summary(added, (50, 90, 99, 99.9), digits=2),
        "tick_wait_ms": summary(wait, (50, 99), digits=2),
        "echo_total_minus_delay_ms": summary((r - s) * 1000.0 - delay * period * 1000.0, (50, 99), digits=2),
        "tick_grid": {
            "windows": len(phases),
            "echoes_consistent_with_grid": round(consistent / used, 4) if used else None,
        },
    }


def analyse_downlink(calls: list[CallRecord], period: float = FRAME_S) -> dict:
    """Agent audio as the callers receive it, any engine. Every tick sends one frame to every live call at
    once, so per 2 s window the tick grid is the leading edge of the arrivals (mod 80 ms: the end of the
    widest empty stretch); ``downlink_added`` is each frame's arrival after its tick. The gaps between a
    call's frames show whether the 80 ms cadence survives."""
    arrivals = [np.asarray(c.audio_arrivals) for c in calls if len(c.audio_arrivals) > 1]
    if not arrivals:
        return {"audio_frames_in": 0}
    gaps = np.concatenate([np.diff(a) for a in arrivals])
    t = np.sort(np.concatenate(arrivals))
    window = np.floor((t - t[0]) / PHASE_WINDOW_S).astype(int)
    added = []
    for part in np.split(t, np.flatnonzero(np.diff(window)) + 1):
        if part.size < 50:
            continue
        m = np.sort(np.mod(part, period))
        spans = np.diff(np.concatenate([m, [m[0] + period]]))
        edge = m[(int(np.argmax(spans)) + 1) % m.size]
        added.append(np.mod(part - edge, period))
    d = np.concatenate(added) * 1000.0 if added else np.zeros(0)
    return {
        "audio_frames_in": int(sum(c.audio_frames_in for c in calls)),
        "downlink_added_ms": summary(d, (50, 99, 99.9), digits=2),
        "gap_minus_80ms_ms": summary((gaps - period) * 1000.0, (50, 99, 99.9), digits=2),
        "note": "downlink_added wraps at 80 ms: a frame a whole tick late reads as early",
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
        audio_s = c.sent[c.frames_sent - 1] - c.sent[0] + FRAME_S
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


def engine_tick(calls: list[CallRecord]) -> dict:
    p50 = [c.last_metrics["tick_ms_p50"] for c in calls if "tick_ms_p50" in c.last_metrics]
    p99 = [c.last_metrics["tick_ms_p99"] for c in calls if "tick_ms_p99" in c.last_metrics]
    late = [c.last_metrics.get("late_ticks", 0) for c in calls if c.last_metrics]
    return {
        "tick_ms_p50_median_of_calls": round(float(np.median(p50)), 2) if p50 else None,
        "tick_ms_p99_worst_call": round(float(max(p99)), 2) if p99 else None,
        "late_ticks_max": int(max(late)) if late else None,
    }


def service_counters(calls: list[CallRecord]) -> dict:
    """The service's own counts (each call's last ``session.metrics``, cumulative per slot): input trimmed by
    the framer (standing depth), ticks that found no new input (underruns), frames dropped in all."""
    out = {name: int(sum(c.counters.get(name, 0) for c in calls)) for name in ("trimmed_frames", "underruns")}
    out["dropped_frames"] = int(sum(c.counters.get("dropped_frames", 0) for c in calls))
    out["in_wait_ms_max_worst_call"] = round(max((c.in_wait_ms_max for c in calls), default=0.0), 1)
    out["out_wait_ms_max_worst_call"] = round(max((c.out_wait_ms_max for c in calls), default=0.0), 1)
    return out


# ---- the run --------------------------------------------------------------------------------------


class Sampler(threading.Thread):
    """RSS per process kind and GPU memory every ``every_s`` while the callers run."""

    def __init__(self, pids: dict[str, list[int]], every_s: float = 10.0):
        super().__init__(daemon=True)
        self.pids, self.every_s, self.rows, self.stop = pids, every_s, [], threading.Event()

    def run(self) -> None:
        start = time.perf_counter()
        while not self.stop.wait(self.every_s):
            row = {"t_s": round(time.perf_counter() - start, 1)}
            row |= {f"{kind}_rss_mb": round(rss_mb(p), 1) for kind, p in self.pids.items()}
            if shutil.which("nvidia-smi"):
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                ).stdout.split()
                row["gpu_mem_mib"] = int(out[0]) if out else None
            self.rows.append(row)


def service_command(args) -> list[str] | None:
    if not args.gpu_service:
        return None
    command = [sys.executable, str(ROOT / "bench" / "serving_gpu_service.py")]
    return [*command, "--tiny"] if args.gpu_service == "tiny" else command


def run(args) -> dict:
    var_dir = Path(tempfile.mkdtemp(prefix="parley-e2e-"))
    speech_path = Path(args.speech) if args.speech else var_dir / "speech.npy"
    make_speech(speech_path)
    extra = dict(kv.split("=", 1) for kv in args.env)
    extra.setdefault("PARLEY_SLOTS", str(args.slots or args.lines + 8))
    try:
        with start_topology(
            lines=args.lines,
            daphnes=args.daphnes,
            services=args.services,
            var_dir=var_dir,
            engine=args.engine,
            delay_frames=args.delay_frames,
            service_command=service_command(args),
            nginx=args.nginx,
            uvloop=args.uvloop,
            extra_env=extra,
        ) as topo:
            ctx = multiprocessing.get_context("fork")
            queue = ctx.Queue()
            t0 = time.perf_counter() + 2.0
            hold_from = t0 + args.ramp_s
            until = hold_from + args.seconds
            params = vars(args) | {"speech": str(speech_path)}
            procs = []
            for g in range(args.gen_procs):
                lines = list(range(g, args.lines, args.gen_procs))
                p = ctx.Process(target=_generator, args=(params, lines, topo.keys, topo.url, t0, until, queue))
                p.start()
                procs.append(p)
            pids = dict(topo.pids) | {"load generator": [p.pid for p in procs]}
            sampler = Sampler(pids)
            sampler.start()
            time.sleep(max(0.0, hold_from - time.perf_counter()))
            cpu_start = {kind: cpu_seconds(p) for kind, p in pids.items()}
            wall_start = time.perf_counter()
            time.sleep(max(0.0, until - time.perf_counter()))
            cpu_end = {kind: cpu_seconds(p) for kind, p in pids.items()}
            wall = time.perf_counter() - wall_start
            calls: list[CallRecord] = []
            for _ in procs:
                calls.extend(queue.get(timeout=args.ramp_s + args.seconds + 600))
            for p in procs:
                p.join(30)
            sampler.stop.set()
            time.sleep(3.0)  # the recorder finishes the last calls' files off the tick's path
            recordings = analyse_recordings(calls, topo, args.recordings_sample, args.render_sample, args.seed)
            logs = error_lines(var_dir)
    finally:
        shutil.rmtree(var_dir, ignore_errors=True)
    cpu = {}
    for kind in cpu_start:
        busy = cpu_end[kind] - cpu_start[kind]
        cores = busy / wall
        cpu[kind] = {
            "processes": len(pids[kind]),
            "cores_busy": round(cores, 3),
            "calls_per_core": round(args.lines / cores, 1) if cores > 0 else None,
        }
    errors: dict[str, int] = {}
    for c in calls:
        for code, n in c.errors.items():
            errors[code] = errors.get(code, 0) + n
    failed = [c.failed for c in calls if c.failed]
    return {
        "bench": "serving_e2e",
        "what": args.what,
        "hardware": results_io.hardware(gpu=args.gpu_service == "gpu"),
        "commit": results_io.commit(),
        "command": " ".join(sys.argv),
        "topology": {
            "engine": args.engine,
            "daphnes": args.daphnes,
            "services": args.services or "in daphne",
            "nginx": bool(args.nginx or args.daphnes > 1),
            "uvloop_daphne": args.uvloop,
            "env": extra,
        },
        "callers": {
            "lines": args.lines,
            "hold_s": args.seconds,
            "ramp_s": args.ramp_s,
            "mean_call_s": args.mean_call_s,
            "max_call_s": args.max_call_s,
            "gen_procs": args.gen_procs,
            "calls": len(calls),
            "calls_failed": len(failed),
            "failures": sorted(set(failed))[:10],
        },
        "host": {
            "cpus_visible": len(os.sched_getaffinity(0)),
            "cpus": os.cpu_count(),
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
        },
        **({"frames": analyse_echoes(calls, args.delay_frames)} if args.engine == "echo" else {}),
        "downlink": analyse_downlink(calls),
        "errors": errors,
        "internal_error": errors.get("internal_error", 0),
        "log_errors": logs,
        "service_counters": service_counters(calls),
        "engine_tick": engine_tick(calls),
        "recordings": recordings,
        "cpu_over_hold": cpu,
        "memory_timeline": sampler.rows,
    }


def headline(result: dict) -> str:
    f = result.get("frames", {})
    lat = f.get("server_added_ms", {})
    cpu = ", ".join(
        f"{k} {v['cores_busy']} cores ({v['calls_per_core']}/core)" for k, v in result["cpu_over_hold"].items()
    )
    return (
        f"{result['what']}: {result['callers']['lines']} lines, {result['callers']['calls']} calls "
        f"({result['callers']['calls_failed']} failed); lost in time {f.get('frames_lost_sent_in_time')} of "
        f"{f.get('frames_sent_in_time')} (generator late {f.get('frames_sent_late_by_generator')}); server-added "
        f"p50 {lat.get('p50')} p99 {lat.get('p99')} ms; tick wait p50 {f.get('tick_wait_ms', {}).get('p50')}; "
        f"internal_error {result['internal_error']}; errors {result['errors']}; recordings raw complete "
        f"{result['recordings']['raw_complete']}/{result['recordings']['raw_sampled']}, rendered "
        f"{result['recordings']['rendered_status']}; downlink added {result['downlink'].get('downlink_added_ms')}; "
        f"service {result['service_counters']}; engine tick "
        f"{result['engine_tick']}; {cpu}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=20, help="callers in progress at once (caller lines)")
    p.add_argument("--seconds", type=float, default=30.0, help="the hold after the ramp")
    p.add_argument("--ramp-s", type=float, default=30.0)
    p.add_argument("--mean-call-s", type=float, default=180.0, help="the call mix: exponential, this mean")
    p.add_argument("--max-call-s", type=float, default=600.0)
    p.add_argument("--daphnes", type=int, default=1)
    p.add_argument("--services", type=int, choices=(0, 1), default=0, help="0: in each daphne; 1: one on a socket")
    p.add_argument("--nginx", action="store_true", help="nginx in front even of one daphne")
    p.add_argument("--uvloop", action="store_true", help="daphne on uvloop")
    p.add_argument(
        "--gpu-service",
        choices=("", "gpu", "tiny"),
        default="",
        help="--services 1 runs bench/serving_gpu_service.py (gpu: 7B shape on CUDA; tiny: the tiny checkpoint on CPU)",
    )
    p.add_argument("--gen-uvloop", action="store_true", help="the load generator on uvloop")
    p.add_argument("--engine", default="echo")
    p.add_argument("--slots", type=int, default=0, help="PARLEY_SLOTS (default lines + 8)")
    p.add_argument("--delay-frames", type=int, default=3)
    p.add_argument("--gen-procs", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--recordings-sample", type=int, default=60, help="raw recordings read back after the run")
    p.add_argument("--render-sample", type=int, default=10, help="of those, post-processed as Celery would")
    p.add_argument("--speech", help="a cached .npy of pcm16 24 kHz speech (made with espeak-ng when absent)")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for every server process")
    p.add_argument("--what", default="serving-e2e-echo")
    p.add_argument("--hardware", help="the results' hardware name (default: results_io's, e.g. 2core or h200)")
    p.add_argument("--out-dir", type=Path, default=results_io.RESULTS)
    args = p.parse_args(argv)
    if args.hardware:
        os.environ["BENCH_HARDWARE"] = args.hardware  # results_io names the file with it
    if not 1 <= args.lines <= 400 or not 1 <= args.seconds <= 3600:
        p.error("--lines must be in 1..400 and --seconds in 1..3600")
    result = run(args)
    print(headline(result), flush=True)
    out = results_io.write_result(result, args.what, gpu=args.gpu_service == "gpu", out=args.out_dir)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
