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
  engine's own tick (``session.metrics``) in the same run; RSS per kind (and GPU memory) every 10 s;
- a unit engine (1 s units): its units as the callers saw them (``analyse_units``: decisions per unit, their
  spread after the tick, the 1 s cadence, the speaking fraction) in place of the echo's frame analysis.

Usage (loopback only)::

    .venv/bin/python bench/serving_e2e.py --lines 200 --seconds 60 --what echo-1daphne --hardware 2core
    python3 bench/serving_e2e.py --engine lockstep --services 1 --daphnes 4 --lines 229 ...
    python3 bench/serving_e2e.py --gpu-service unit --services 1 --slots 64 --lines 64 ...  # MiniCPM-o 4.5 shapes
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from queue import Empty

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import results_io  # noqa: E402
from bench.serving_analysis import (  # noqa: E402
    analyse_downlink,
    analyse_echoes,
    analyse_recordings,
    analyse_units,
    calls_held,
    engine_tick,
    service_counters,
)
from bench.serving_callers import CallRecord, caller_line  # noqa: E402
from bench.serving_topology import cpu_seconds, error_lines, start_topology  # noqa: E402
from bench.serving_watch import Sampler, profile_service  # noqa: E402
from inference.config import InferenceConfig  # noqa: E402

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
    if args_dict.get("gen_uvloop"):  # asked for and absent: an ImportError, not a slower generator unsaid
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
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
                    follow_phase=args_dict.get("follow_phase", False),
                )
                for i in lines
            )
        )

    asyncio.run(main())
    for c in calls:
        c.audio_arrivals = np.asarray(c.audio_arrivals, dtype=np.float64)
        c.decisions_at = np.asarray(c.decisions_at, dtype=np.float64)
        c.tail = np.zeros(0, dtype=np.int32)
    out.put(calls)


# ---- the run --------------------------------------------------------------------------------------


def collect_calls(queue, procs: list, *, deadline: float, poll_s: float = 5.0) -> list[CallRecord]:
    """Every load generator's calls. One that died without reporting (an import missing on a device, killed for
    memory) ends the wait with an error naming its exit code, instead of the run waiting out its deadline: on
    the GPU host that was a whole 10-minute command gone with nothing to show."""
    calls: list[CallRecord] = []
    reported = 0
    while reported < len(procs):
        try:
            calls.extend(queue.get(timeout=poll_s))
            reported += 1
            continue
        except Empty:
            pass
        dead = [p for p in procs if not p.is_alive()]
        if len(dead) > reported:  # a generator's results are in the pipe before it exits: one more look
            try:
                calls.extend(queue.get(timeout=poll_s))
                reported += 1
                continue
            except Empty:
                codes = sorted(p.exitcode for p in dead)
                missing = len(dead) - reported
                message = (
                    f"{missing} load generator(s) died without reporting (exit codes of those that ended: {codes})"
                )
                raise RuntimeError(message) from None
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{len(procs) - reported} load generator(s) did not report in time")
    return calls


def save_calls(calls: list[CallRecord], path: Path) -> None:
    """Every call's send and echo time per frame (perf_counter; NaN = never), the frames it sent and its line."""
    arrays = {}
    for i, c in enumerate(calls):
        arrays[f"sent_{i}"], arrays[f"echoed_{i}"] = c.sent[: c.frames_sent], c.echoed[: c.frames_sent]
    arrays["lines"] = np.array([c.line for c in calls])
    np.savez_compressed(path, **arrays)


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    p50, p99 = np.percentile(values, [50, 99])
    return {"n": len(values), "p50": round(float(p50), 2), "p99": round(float(p99), 2), "max": round(max(values), 2)}


# --gpu-service -> (the engine it serves, bench/serving_gpu_service.py's arguments)
GPU_SERVICES = {
    "gpu": ("lockstep", []),
    "tiny": ("lockstep", ["--tiny"]),
    "unit": ("unit", ["--engine", "unit"]),
    "unit-tiny": ("unit", ["--engine", "unit", "--tiny"]),
}


def service_command(args) -> list[str] | None:
    if not args.gpu_service:
        return None
    extra = GPU_SERVICES[args.gpu_service][1]
    if args.gpu_service.startswith("unit"):
        extra = [*extra, "--vocoder", args.vocoder]
    extra = [*extra, *shlex.split(args.service_args)]
    return [sys.executable, str(ROOT / "bench" / "serving_gpu_service.py"), *extra]


def on_gpu(args) -> bool:
    return args.gpu_service in ("gpu", "unit")


def run(args) -> dict:
    var_dir = Path(tempfile.mkdtemp(prefix="parley-e2e-"))
    speech_path = Path(args.speech) if args.speech else var_dir / "speech.npy"
    make_speech(speech_path)
    extra = dict(kv.split("=", 1) for kv in args.env)
    extra.setdefault("PARLEY_SLOTS", str(args.slots or args.lines + 8))
    # A deployment's queue (the transport benches' environment turns it off): at the limit callers wait in it
    extra.setdefault("PARLEY_QUEUE_MAX", str(args.queue_max))
    started = time.perf_counter()
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
            start_s = time.perf_counter() - started  # a GPU service's build and warm-up, mostly
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
            service = topo.env.get("PARLEY_INFERENCE_URL")
            if service:  # the sampler's occupancy calls prove the token as the web tier does
                os.environ["PARLEY_INFERENCE_TOKEN"] = topo.env["PARLEY_INFERENCE_TOKEN"]
            sampler = Sampler(pids, service=service)
            sampler.start()
            time.sleep(max(0.0, hold_from - time.perf_counter()))
            cpu_start = {kind: cpu_seconds(p) for kind, p in pids.items()}
            wall_start = time.perf_counter()
            if args.profile_s:  # the service's threads, by default in the hold's middle
                at = args.profile_at_s if args.profile_at_s is not None else args.seconds / 2 - args.profile_s / 2
                time.sleep(max(0.0, at))
                stem = f"{args.what}-service-profile"
                out = Path(args.out_dir or ".")
                profile_service(pids, args.profile_s, out / f"{stem}.jsonl.gz")
                if args.profile_gil:  # then as long again, only the thread that holds the interpreter
                    profile_service(pids, args.profile_s, out / f"{stem}-gil.jsonl.gz", gil=True)
            time.sleep(max(0.0, until - time.perf_counter()))
            cpu_end = {kind: cpu_seconds(p) for kind, p in pids.items()}
            wall = time.perf_counter() - wall_start
            calls = collect_calls(queue, procs, deadline=time.perf_counter() + 600)
            if args.calls_out:
                save_calls(calls, args.calls_out)
            for p in procs:
                p.join(30)
            sampler.stop.set()
            time.sleep(3.0)  # the recorder finishes the last calls' files off the tick's path
            recordings = analyse_recordings(calls, topo, args.recordings_sample, args.render_sample, args.seed)
            logs = error_lines(var_dir)
    finally:
        shutil.rmtree(var_dir, ignore_errors=True)
    held = calls_held(calls, wall_start, wall_start + wall)  # what the CPU over the hold carried
    cpu = {}
    for kind in cpu_start:
        busy = cpu_end[kind] - cpu_start[kind]
        cores = busy / wall
        cpu[kind] = {
            "processes": len(pids[kind]),
            "cores_busy": round(cores, 3),
            "calls_per_core": round(held["mean"] / cores, 1) if cores > 0 and held["mean"] else None,
        }
    errors: dict[str, int] = {}
    for c in calls:
        for code, n in c.errors.items():
            errors[code] = errors.get(code, 0) + n
    failed = [c.failed for c in calls if c.failed]
    return {
        "bench": "serving_e2e",
        "what": args.what,
        "hardware": results_io.hardware(gpu=on_gpu(args)),
        "commit": results_io.commit(),
        "command": " ".join(sys.argv),
        "topology": {
            "engine": args.engine,
            "gpu_service": args.gpu_service or None,
            # the unit engine's vocoder and the LLM positions a call keeps (PARLEY_UNIT_CONTEXT, passed on to it)
            **(
                {"vocoder": args.vocoder, "unit_context": InferenceConfig.from_env().unit_context}
                if args.engine == "unit"
                else {}
            ),
            # the lockstep engine's context in frames (PARLEY_LOCKSTEP_CONTEXT; 0: the checkpoint's)
            **({"lockstep_context": InferenceConfig.from_env().lockstep_context} if args.engine == "lockstep" else {}),
            "daphnes": args.daphnes,
            "services": args.services or "in daphne",
            "nginx": bool(args.nginx or args.daphnes > 1),
            "uvloop_daphne": args.uvloop,
            "env": extra,
            # every process inherits the bench's environment: an allocator setting changes what RSS shows
            "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
            "started_in_s": round(start_s, 1),
        },
        "callers": {
            "lines": args.lines,
            "hold_s": args.seconds,
            "ramp_s": args.ramp_s,
            "mean_call_s": args.mean_call_s,
            "max_call_s": args.max_call_s,
            "gen_procs": args.gen_procs,
            "gen_uvloop": args.gen_uvloop,
            "calls": len(calls),
            "calls_failed": len(failed),
            "failures": dict(Counter(failed).most_common(10)),  # how many calls failed each way
            "calls_queued": sum(c.queued for c in calls),  # made to wait for admission (slots, memory, time)
            "calls_gave_up_queued": sum(c.gave_up_queued for c in calls),  # still waiting when the run ended
            "held_over_hold": held,
            "admission_wait_s": _percentiles([c.opened_at - c.connected_at for c in calls if c.queued and c.opened_at]),
        },
        "host": {
            "cpus_visible": len(os.sched_getaffinity(0)),
            "cpus": os.cpu_count(),
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
        },
        **({"frames": analyse_echoes(calls, args.delay_frames)} if args.engine == "echo" else {}),
        **({"units": analyse_units(calls)} if args.engine == "unit" else {}),
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
        f"{result['what']}: {result['callers']['lines']} lines, {result['callers']['held_over_hold']['mean']} calls "
        f"held on average over the hold, {result['callers']['calls']} calls "
        f"({result['callers']['calls_failed']} failed, {result['callers']['calls_queued']} queued: wait "
        f"{result['callers']['admission_wait_s']} s); lost in time {f.get('frames_lost_sent_in_time')} of "
        f"{f.get('frames_sent_in_time')} (generator late {f.get('frames_sent_late_by_generator')}); server-added "
        f"p50 {lat.get('p50')} p99 {lat.get('p99')} ms; tick wait p50 {f.get('tick_wait_ms', {}).get('p50')}; "
        f"internal_error {result['internal_error']}; errors {result['errors']}; recordings raw complete "
        f"{result['recordings']['raw_complete']}/{result['recordings']['raw_sampled']}, rendered "
        f"{result['recordings']['rendered_status']}; downlink added {result['downlink'].get('downlink_added_ms')}; "
        f"service {result['service_counters']}; engine tick "
        f"{result['engine_tick']}; {cpu}" + (f"; units {result['units']}" if "units" in result else "")
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=20, help="callers in progress at once (caller lines)")
    p.add_argument("--seconds", type=float, default=30.0, help="the hold after the ramp")
    p.add_argument(
        "--profile-s",
        type=float,
        default=0.0,
        help="py-spy the service this long, mid-hold unless --profile-at-s (0: no)",
    )
    p.add_argument("--profile-at-s", type=float, default=None, help="start the profile this far into the hold")
    p.add_argument("--profile-gil", action="store_true", help="then profile as long again with py-spy --gil")
    p.add_argument("--ramp-s", type=float, default=30.0)
    p.add_argument("--mean-call-s", type=float, default=180.0, help="the call mix: exponential, this mean")
    p.add_argument("--max-call-s", type=float, default=600.0)
    p.add_argument("--daphnes", type=int, default=1)
    p.add_argument("--services", type=int, choices=(0, 1), default=0, help="0: in each daphne; 1: one on a socket")
    p.add_argument("--nginx", action="store_true", help="nginx in front even of one daphne")
    p.add_argument("--uvloop", action="store_true", help="daphne on uvloop")
    p.add_argument(
        "--gpu-service",
        choices=("", *GPU_SERVICES),
        default="",
        help="--services 1 runs bench/serving_gpu_service.py (gpu: lockstep 7B shape on CUDA; tiny: its tiny "
        "checkpoint on CPU; unit: MiniCPM-o 4.5 shapes on CUDA; unit-tiny: its tiny checkpoint on CPU)",
    )
    p.add_argument("--vocoder", choices=("none", "token2wav"), default="none", help="the unit engine's vocoder")
    p.add_argument("--gen-uvloop", action="store_true", help="the load generator on uvloop")
    p.add_argument(
        "--follow-phase", action="store_true", help="callers follow session.metrics' phase advice (input_shift_ms)"
    )
    p.add_argument("--engine", default="echo")
    p.add_argument("--slots", type=int, default=0, help="PARLEY_SLOTS (default lines + 8)")
    p.add_argument("--queue-max", type=int, default=8, help="PARLEY_QUEUE_MAX (the service's default: 8)")
    p.add_argument("--delay-frames", type=int, default=3)
    p.add_argument("--gen-procs", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--recordings-sample", type=int, default=60, help="raw recordings read back after the run")
    p.add_argument("--render-sample", type=int, default=10, help="of those, post-processed as Celery would")
    p.add_argument("--speech", help="a cached .npy of pcm16 24 kHz speech (made with espeak-ng when absent)")
    p.add_argument(
        "--service-args", default="", help="more arguments for bench/serving_gpu_service.py, e.g. its --memory-log"
    )
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for every server process")
    p.add_argument("--what", default="serving-e2e-echo")
    p.add_argument("--calls-out", type=Path, help="every call's frame times, as .npz, for a closer look")
    p.add_argument("--hardware", help="the results' hardware name (default: results_io's, e.g. 2core or h200)")
    p.add_argument("--out-dir", type=Path, default=results_io.RESULTS)
    args = p.parse_args(argv)
    if args.hardware:
        os.environ["BENCH_HARDWARE"] = args.hardware  # results_io names the file with it
    if not 1 <= args.lines <= 400 or not 1 <= args.seconds <= 3600:
        p.error("--lines must be in 1..400 and --seconds in 1..3600")
    if args.gpu_service:
        served = GPU_SERVICES[args.gpu_service][0]
        if args.services != 1 or args.engine not in ("echo", served):  # echo: --engine left at its default
            p.error(f"--gpu-service {args.gpu_service} serves the {served} engine with --services 1")
        args.engine = served
    result = run(args)
    print(headline(result), flush=True)
    out = results_io.write_result(result, args.what, gpu=on_gpu(args), out=args.out_dir)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
