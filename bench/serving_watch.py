"""What ``bench/serving_e2e.py`` samples from the processes it drives while the callers run: RSS per process kind
and GPU memory every 10 s, the service's occupancy and tick window beside them, and py-spy's stacks of the
service mid-hold (``--profile-s``)."""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

from bench.serving_topology import rss_mb


class Sampler(threading.Thread):
    """RSS per process kind and GPU memory every ``every_s`` while the callers run, and with a separate service
    what its engine held and how it ticked (so a run that goes wrong shows when, beside the calls held)."""

    def __init__(self, pids: dict[str, list[int]], every_s: float = 10.0, service: str | None = None):
        super().__init__(daemon=True)
        self.pids, self.every_s, self.rows, self.stop = pids, every_s, [], threading.Event()
        self.service = service

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
            if self.service:
                row |= service_row(self.service)
            self.rows.append(row)


def service_row(address: str) -> dict:
    """The service's sessions in slots and their mean age (a live call's cost grows with its context), its queue,
    and the 90th percentile of its last 25 ticks (the window time admission judges)."""
    from inference.transport.client import remote_occupancy

    try:
        (snapshot,) = asyncio.run(asyncio.wait_for(remote_occupancy(address), 5.0))
    except Exception as exc:  # noqa: BLE001 - a missed sample is noted, the run goes on
        return {"service_status_error": f"{type(exc).__name__}: {exc}"[:120]}
    held = [s.age_s for s in snapshot.slots if s.state not in ("free", "closing")]
    recent = list(snapshot.recent_tick_ms[-25:])
    return {
        "slots_held": len(held),
        "slots_mean_age_s": round(float(np.mean(held)), 1) if held else None,
        "queue_length": snapshot.queue_length,
        "tick_ms_p90_last25": round(float(np.percentile(recent, 90)), 1) if recent else None,
    }


def profile_service(pids: dict[str, list[int]], seconds: float, out: Path, *, gil: bool = False) -> None:
    """py-spy's stacks of every service thread for ``seconds``, without pausing it (a paused tick would be late),
    written to ``out`` (.jsonl.gz) one stack a line with its sample count; wants py-spy on PATH (the GPU carry
    has it) and ptrace, and says why when it cannot. ``gil``: only the thread holding the interpreter at each
    sample (who keeps the tick's thread waiting for it), where the default shows every thread that is busy."""
    service = pids.get("service")
    if not service or shutil.which("py-spy") is None:
        print("profile: no service process or no py-spy on PATH", flush=True)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.with_suffix(".raw")
    command = ["py-spy", "record", "--nonblocking", "--threads", "--rate", "100", "--format", "raw"]
    command += ["--gil"] if gil else []
    command += ["--duration", str(int(seconds)), "--output", str(raw), "--pid", str(service[0])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        print(f"profile: {done.stderr.strip()[-300:]}", flush=True)
        return
    with gzip.open(out, "wt") as lines:
        for line in raw.read_text().splitlines():  # "thread (tid): name;frame;frame... samples"
            stack, _, samples = line.rpartition(" ")
            thread, *frames = stack.split(";")
            lines.write(json.dumps({"thread": thread, "stack": frames, "samples": int(samples)}) + "\n")
    raw.unlink()
    print(f"profile: {out}", flush=True)
