"""Transport benchmark: N synthetic clients against the echo engine, no model in the loop.

Measures what the serving path adds to each 80 ms frame: client -> ``/v1/realtime`` (daphne +
Channels consumer) -> inference facade -> worker tick -> echo -> back to the client. The echo
engine returns frame k exactly ``delay`` ticks after it consumed it, so

    server-added latency of frame k = (receive time of its echo - send time of frame k) - delay * 80 ms

which includes the wait for the next tick of the engine clock (0-80 ms): that wait is real for any
lockstep model too. Each frame carries its index in every sample, so echoes are matched exactly.

Usage (loopback only; counts and durations are bounded)::

    .venv/bin/python bench/transport.py --clients 50 --seconds 20
    .venv/bin/python bench/transport.py --via facade --clients 50 --seconds 20   # no web tier
    .venv/bin/python bench/transport.py --via cluster --clients 100 --seconds 20  # nginx, 2 daphne, 2 services

``--via ws`` starts daphne on 127.0.0.1 (free port) with ``webapp.settings.local`` in a temporary
var dir (its own SQLite DB), creates one user + API key per client, and samples the daphne
process's CPU with psutil. ``--via facade`` drives ``inference.api`` in this process. ``--via cluster``
starts make cluster's topology (PostgreSQL, Redis, two echo services on TCP, two daphne behind
nginx; tests/cluster/topology.py) and connects every client through nginx.
Prints a table and writes JSON (default ``bench/results/transport-<via>-<N>clients-<cores>core-<commit>.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
FRAME_S = 0.080
FRAME_SAMPLES = 1920  # 80 ms at 24 kHz
MAX_CLIENTS = 200
MAX_SECONDS = 120
sys.path.insert(0, str(ROOT))
from bench.results_io import write_result  # noqa: E402
from bench.stats import summary  # noqa: E402
from bench.transport_daphne import SETUP_SCRIPT, keys_printed, start_daphne  # noqa: E402


@dataclass
class ClientStats:
    sent: dict[int, float] = field(default_factory=dict)  # frame index -> perf_counter at send
    received: dict[int, float] = field(default_factory=dict)  # frame index -> perf_counter of its echo
    errors: dict[str, int] = field(default_factory=dict)
    last_metrics: dict = field(default_factory=dict)
    max_out_wait_ms: float = 0.0  # the service's own view: audio waiting for the web tier to take it
    max_in_wait_ms: float = 0.0  # the service's own view: input waiting in the inbox for a tick
    failed: str | None = None


def marked_frame(k: int) -> bytes:
    """Frame k: every sample equals k + 1 (0 is the engine's silence)."""
    return np.full(FRAME_SAMPLES, k + 1, dtype="<i2").tobytes()


def note_echoes(pcm16: bytes, stats: ClientStats, now: float) -> None:
    samples = np.frombuffer(pcm16, dtype="<i2")
    for start in range(0, len(samples), FRAME_SAMPLES):
        value = int(samples[start])
        if value > 0 and value - 1 in stats.sent and value - 1 not in stats.received:
            stats.received[value - 1] = now


def note_metrics(values: dict, stats: ClientStats) -> None:
    stats.last_metrics = values
    stats.max_out_wait_ms = max(stats.max_out_wait_ms, float(values.get("out_wait_ms_max", 0.0)))
    stats.max_in_wait_ms = max(stats.max_in_wait_ms, float(values.get("in_wait_ms_max", 0.0)))


async def paced_send(frames: int, send, stats: ClientStats) -> None:
    """Send frames on an absolute 80 ms schedule (no drift); frames overdue after a stall go at once,
    as a browser's buffered audio would."""
    loop = asyncio.get_running_loop()
    # Each client gets its own phase against the engine clock, as real users would.
    start = loop.time() + 0.05 + random.uniform(0.0, FRAME_S)
    for k in range(frames):
        delay = start + k * FRAME_S - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        stats.sent[k] = time.perf_counter()
        await send(k)


# ---- via the WebSocket endpoint -----------------------------------------------------------------


async def ws_client(
    url: str, key: str, frames: int, delay_frames: int, stats: ClientStats, start_after_s: float = 0.0
) -> None:
    from websockets.asyncio.client import connect

    await asyncio.sleep(start_after_s)  # --ramp-s: users arrive over a while, not in one instant
    payloads = [base64.b64encode(marked_frame(k)).decode() for k in range(frames)]
    try:
        async with connect(url, additional_headers={"Authorization": f"Bearer {key}"}, max_size=2**22) as ws:
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if event["type"] == "session.created":
                    break
                if event["type"] == "error":
                    stats.failed = event["error"]["code"]
                    return
            fmt = {"type": "audio/pcm", "rate": 24000}
            await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": fmt}}}}))

            async def receive() -> None:
                async for message in ws:
                    now = time.perf_counter()
                    if isinstance(message, bytes):
                        note_echoes(message[1:], stats, now)
                        continue
                    event = json.loads(message)
                    kind = event["type"]
                    if kind == "response.output_audio.delta":
                        note_echoes(base64.b64decode(event["delta"]), stats, now)
                    elif kind == "session.metrics":
                        note_metrics(event.get("metrics") or {}, stats)
                    elif kind == "error":
                        code = event["error"]["code"]
                        stats.errors[code] = stats.errors.get(code, 0) + 1

            receiver = asyncio.create_task(receive())

            async def send(k: int) -> None:
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": payloads[k]}))

            await paced_send(frames, send, stats)
            await asyncio.sleep((delay_frames + 6) * FRAME_S)  # the last echoes are still in flight
            await ws.send(json.dumps({"type": "session.close"}))
            receiver.cancel()
    except Exception as exc:  # noqa: BLE001 - a failed client is reported, the others go on
        stats.failed = f"{type(exc).__name__}: {exc}"


class CpuSampler:
    """Samples a process's CPU (all threads) once a second while the clients run."""

    def __init__(self, pid: int):
        self.process = psutil.Process(pid)
        self.samples: list[float] = []
        self.process.cpu_percent(None)
        self._start = self.process.cpu_times()
        self._wall = time.perf_counter()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.samples.append(self.process.cpu_percent(None))

    def summary(self) -> dict:
        end = self.process.cpu_times()
        wall = time.perf_counter() - self._wall
        busy = (end.user - self._start.user) + (end.system - self._start.system)
        return {
            "cpu_percent_mean": round(100.0 * busy / wall, 1),
            "cpu_percent_max_1s": round(max(self.samples, default=0.0), 1),
            "cpu_seconds": round(busy, 2),
            "wall_seconds": round(wall, 2),
        }


async def run_ws_clients(
    args, url: str, keys: list[str], server_pids: dict[str, int]
) -> tuple[list[ClientStats], dict]:
    """Run the clients against ``url`` while sampling the CPU of each server process (name -> pid)."""
    frames = int(args.seconds / FRAME_S)
    stats = [ClientStats() for _ in range(args.clients)]
    samplers = {name: CpuSampler(pid) for name, pid in server_pids.items()}
    client_sampler = CpuSampler(os.getpid())
    sampling = [asyncio.create_task(s.run()) for s in (*samplers.values(), client_sampler)]
    try:
        await asyncio.gather(
            *(
                ws_client(url, keys[i], frames, args.delay_frames, stats[i], i * args.ramp_s / args.clients)
                for i in range(args.clients)
            )
        )
    finally:
        for task in sampling:
            task.cancel()
    clients_cpu = client_sampler.summary()["cpu_percent_mean"]
    summaries = {name: sampler.summary() for name, sampler in samplers.items()}
    if len(summaries) == 1:
        ((name, summary),) = summaries.items()
        return stats, {"server_process": name, **summary, "bench_clients_cpu_percent_mean": clients_cpu}
    total = {
        "server_process": " + ".join(summaries) + " (sum)",
        "cpu_percent_mean": round(sum(s["cpu_percent_mean"] for s in summaries.values()), 1),
        "cpu_percent_max_1s": round(sum(s["cpu_percent_max_1s"] for s in summaries.values()), 1),
        "per_process": summaries,
    }
    return stats, {**total, "bench_clients_cpu_percent_mean": clients_cpu}


def run_via_ws(args) -> tuple[list[ClientStats], dict]:
    var_dir = Path(tempfile.mkdtemp(prefix="parley-bench-"))
    proc = None
    try:
        proc, url, keys = start_daphne(args, var_dir)
        return asyncio.run(run_ws_clients(args, url, keys, {"daphne": proc.pid}))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(var_dir, ignore_errors=True)


# ---- via nginx, two daphne processes and two inference services (make cluster's topology) ----------


def run_via_cluster(args) -> tuple[list[ClientStats], dict]:
    """The loopback cluster (tests/cluster/topology.py): clients -> nginx -> 2 daphne -> 2 echo services on TCP."""
    from tests.cluster.topology import Cluster

    per_service = -(-args.clients // 2) + 2  # placement spreads the calls; a little room for imbalance
    env = {
        "PARLEY_ECHO_DELAY_FRAMES": str(args.delay_frames),
        "PARLEY_QUEUE_MAX": "0",
        "PARLEY_CONNECT_RATE": "100000/minute",
    }
    with Cluster(
        services=2, daphnes=2, slots=per_service, celery=False, postgres=not args.sqlite, extra_env=env
    ) as cluster:
        out = cluster.manage("shell", "-c", SETUP_SCRIPT.format(clients=args.clients))
        keys = keys_printed(out)
        pids = {p.name: p.popen.pid for p in cluster.processes if p.popen is not None}
        pids["nginx worker"] = psutil.Process(cluster.nginx.pid).children()[0].pid  # the master only supervises
        return asyncio.run(run_ws_clients(args, f"{cluster.nginx.ws_url}/v1/realtime", keys, pids))


# ---- via the facade, in this process ------------------------------------------------------------


async def facade_client(user: str, frames: int, delay_frames: int, stats: ClientStats) -> None:
    from inference import api
    from inference.contracts import AudioOut, ErrorEvent, Metrics, ParleyError, Ready, SessionRequest

    try:
        handle = await api.open_session(SessionRequest(user_key=user))
    except ParleyError as exc:
        stats.failed = exc.code
        return
    events = handle.events()
    first = await anext(events)
    if not isinstance(first, Ready):
        stats.failed = f"not admitted: {first}"
        return

    async def receive() -> None:
        async for event in events:
            if isinstance(event, AudioOut):
                note_echoes(event.pcm16, stats, time.perf_counter())
            elif isinstance(event, Metrics):
                note_metrics(event.values, stats)
            elif isinstance(event, ErrorEvent):
                stats.errors[event.code] = stats.errors.get(event.code, 0) + 1

    receiver = asyncio.create_task(receive())

    async def send(k: int) -> None:
        await handle.append_audio(marked_frame(k), encoding="pcm16", rate=24000)

    await paced_send(frames, send, stats)
    await asyncio.sleep((delay_frames + 6) * FRAME_S)
    await handle.close()
    receiver.cancel()


async def run_via_facade(args) -> tuple[list[ClientStats], dict]:
    from inference import api

    await api.start(
        engine="echo", slots=args.clients, queue_max=0, echo_delay_frames=args.delay_frames, inference_url=None
    )
    frames = int(args.seconds / FRAME_S)
    stats = [ClientStats() for _ in range(args.clients)]
    sampler = CpuSampler(os.getpid())
    sampling = asyncio.create_task(sampler.run())
    try:
        await asyncio.gather(
            *(facade_client(f"bench{i}", frames, args.delay_frames, stats[i]) for i in range(args.clients))
        )
        ticks = (await api.occupancy())[0]
    finally:
        sampling.cancel()
        await api.shutdown()
    extra = {"server_process": "this process (clients + service)", "tick_ms_p50": ticks.tick_ms_p50}
    return stats, {**extra, "tick_ms_p99": ticks.tick_ms_p99, **sampler.summary()}


# ---- report -------------------------------------------------------------------------------------


def summarize(args, stats: list[ClientStats], cpu: dict) -> dict:
    latencies, sent, received, dropped = [], 0, 0, 0
    for s in stats:
        if s.failed:
            continue
        countable = [k for k in s.sent if k < len(s.sent) - (args.delay_frames + 2)]
        sent += len(countable)
        for k in countable:
            if k in s.received:
                received += 1
                latencies.append((s.received[k] - s.sent[k] - args.delay_frames * FRAME_S) * 1000.0)
            else:
                dropped += 1
    lat = np.asarray(latencies) if latencies else np.zeros(1)
    errors: dict[str, int] = {}
    for s in stats:
        for code, n in s.errors.items():
            errors[code] = errors.get(code, 0) + n
    return {
        "bench": "transport",
        "engine": "echo (no model)",
        "via": args.via,
        "clients": args.clients,
        "seconds": args.seconds,
        "ramp_s": args.ramp_s,
        "database": "postgresql" if args.via == "cluster" and not args.sqlite else "sqlite",
        "delay_frames": args.delay_frames,
        "host": {
            "cpus": psutil.cpu_count(),
            "load_avg_1m_after": round(os.getloadavg()[0], 2),  # other work on the host skews everything
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "clients_failed": [s.failed for s in stats if s.failed],
        "frames_sent": sent,
        "frames_echoed": received,
        "frames_dropped": dropped,
        "server_added_ms": summary(lat, (50, 90, 99), digits=2, count=None),
        "server_cpu": cpu,
        # The service's own view, per client: the worst wait of input in the inbox (for a tick) and
        # of output in the outbox (for the web tier to take it).
        "service_in_wait_ms_max": _spread([s.max_in_wait_ms for s in stats]),
        "service_out_wait_ms_max": _spread([s.max_out_wait_ms for s in stats]),
        "errors": errors,
        "last_session_metrics": next((s.last_metrics for s in stats if s.last_metrics), {}),
    }


def _spread(values: list[float]) -> dict:
    return {"median_client": round(float(np.median(values)), 1), "worst_client": round(max(values), 1)}


def print_table(result: dict) -> None:
    lat, cpu = result["server_added_ms"], result["server_cpu"]
    rows = [
        ("via", result["via"]),
        ("clients x seconds", f"{result['clients']} x {result['seconds']} s"),
        ("clients failed", len(result["clients_failed"])),
        (
            "frames sent / echoed / dropped",
            f"{result['frames_sent']} / {result['frames_echoed']} / {result['frames_dropped']}",
        ),
        ("server-added ms p50 / p90 / p99 / max", f"{lat['p50']} / {lat['p90']} / {lat['p99']} / {lat['max']}"),
        (f"CPU of {cpu['server_process']}", f"mean {cpu['cpu_percent_mean']}%  max(1 s) {cpu['cpu_percent_max_1s']}%"),
        (
            "in-wait ms max: median / worst client",
            "{median_client} / {worst_client}".format(**result["service_in_wait_ms_max"]),
        ),
        (
            "out-wait ms max: median / worst client",
            "{median_client} / {worst_client}".format(**result["service_out_wait_ms_max"]),
        ),
        ("errors", result["errors"] or "none"),
        ("host CPUs / load avg (1 min)", f"{result['host']['cpus']} / {result['host']['load_avg_1m_after']}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--delay-frames", type=int, default=3)
    parser.add_argument("--via", choices=("ws", "facade", "cluster"), default="ws")
    parser.add_argument("--sqlite", action="store_true", help="--via cluster on a host without PostgreSQL")
    parser.add_argument(
        "--ramp-s", type=float, default=0.0, help="spread the WebSocket clients' connects over this many seconds"
    )
    parser.add_argument("--out", type=Path, default=None, help="a file, or a directory for the named result")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= MAX_CLIENTS or not 1 <= args.seconds <= MAX_SECONDS:
        parser.error(f"--clients must be in 1..{MAX_CLIENTS} and --seconds in 1..{MAX_SECONDS}")
    if args.via == "ws":
        stats, cpu = run_via_ws(args)
    elif args.via == "cluster":
        stats, cpu = run_via_cluster(args)
    else:
        stats, cpu = asyncio.run(run_via_facade(args))
    result = summarize(args, stats, cpu)
    print_table(result)
    print(f"wrote {write_result(result, f'transport-{args.via}-{args.clients}clients', out=args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
