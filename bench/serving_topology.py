"""The serving topology bench/serving_e2e.py drives, on loopback: [nginx ->] N daphne -> the service(s).

- ``services=0``: every daphne runs the inference service in its own process (``PARLEY_INFERENCE_URL``
  unset), as ``make run`` does;
- ``services=1``: one ``python -m inference serve`` on a unix socket that every daphne reaches
  (``PARLEY_INFERENCE_URL=unix://...``): one GPU's service behind a web tier of N processes, no registry.

nginx (``tests/cluster/nginx.py``'s template) fronts the daphnes when there are several, or when asked.
The web tier's database is SQLite in a temporary var dir (touched at session edges only, never per frame);
one user and API key per caller line. Every process is started here and stopped on exit.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.transport_daphne import create_keys, django_env, free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[1]
# daphne on uvloop: the asyncio loop twisted's asyncioreactor runs on comes from the event loop policy.
DAPHNE = (
    "import sys; from daphne.cli import CommandLineInterface; sys.argv[0] = 'daphne'; CommandLineInterface.entrypoint()"
)
UVLOOP_DAPHNE = (
    "import asyncio, sys, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy()); "
    "from daphne.cli import CommandLineInterface; sys.argv[0] = 'daphne'; CommandLineInterface.entrypoint()"
)


@dataclass
class Topology:
    url: str
    keys: list[str]
    pids: dict[str, list[int]] = field(default_factory=dict)  # process kind -> pids
    recordings_dir: Path = Path()
    var_dir: Path = Path()
    env: dict[str, str] = field(default_factory=dict)


def _spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    handle = log.open("wb")
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)


def _wait_for_socket(path: Path, proc: subprocess.Popen, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the inference service exited with {proc.returncode}")
        if path.exists():
            return
        time.sleep(0.2)
    raise SystemExit(f"the inference service did not listen on {path} within {within_s:g} s")


@contextlib.contextmanager
def start_topology(
    *,
    lines: int,
    daphnes: int,
    services: int,
    var_dir: Path,
    engine: str,
    delay_frames: int,
    nginx: bool,
    uvloop: bool,
    extra_env: dict[str, str],
    service_start_s: float = 600.0,
    service_command: list[str] | None = None,
) -> Iterator[Topology]:
    env = django_env(var_dir, lines, delay_frames)
    env |= {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
        "PARLEY_ENGINE": engine,
        "PARLEY_RECORDINGS_DIR": str(var_dir / "recordings" / "raw"),
        "PARLEY_LOG_LEVEL": "WARNING",
        # Post-processing queues (in memory) instead of running inline in daphne: a deployment runs it in
        # Celery workers, and the bench renders a sample of the recordings itself after the run.
        "CELERY_BROKER_URL": "memory://",
        **extra_env,
    }
    (var_dir / "logs").mkdir(parents=True, exist_ok=True)
    keys = create_keys(env, lines)
    procs: list[subprocess.Popen] = []
    pids: dict[str, list[int]] = {}
    try:
        yield from _started(
            env, keys, procs, pids, daphnes, services, var_dir, nginx, uvloop, service_start_s, service_command
        )
    except SystemExit:
        for name, tail in service_log_tail(var_dir).items():  # why a process did not come up
            print(f"---- {name} ----\n{tail}", file=sys.stderr)
        raise
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _started(  # the processes of start_topology, in start order
    env, keys, procs, pids, daphnes, services, var_dir, nginx, uvloop, service_start_s, service_command
) -> Iterator[Topology]:
    if services:
        (var_dir / "run").mkdir(mode=0o700)
        sock = var_dir / "run" / "inference.sock"
        env["PARLEY_INFERENCE_TOKEN"] = secrets.token_urlsafe(32)
        command = service_command or [sys.executable, "-m", "inference", "serve"]
        service = _spawn(
            [*command, "--socket", str(sock)],
            env,
            var_dir / "logs" / "service.log",
        )
        procs.append(service)
        pids["service"] = [service.pid]
        _wait_for_socket(sock, service, service_start_s)
        env["PARLEY_INFERENCE_URL"] = f"unix://{sock}"
    ports = [free_port() for _ in range(daphnes)]
    daphne = Path(sys.executable).with_name("daphne")
    plain = [str(daphne)] if daphne.exists() else [sys.executable, "-c", DAPHNE]  # a --target install has no script
    for i, port in enumerate(ports):
        args = ["-b", "127.0.0.1", "-p", str(port), "webapp.asgi:application"]
        command = [sys.executable, "-c", UVLOOP_DAPHNE, *args] if uvloop else [*plain, *args]
        proc = _spawn(command, env, var_dir / "logs" / f"daphne-{i + 1}.log")
        procs.append(proc)
        pids.setdefault("daphne", []).append(proc.pid)
    for port, proc in zip(ports, procs[-daphnes:], strict=True):
        wait_for_port(port, proc, within_s=service_start_s if not services else 60.0)
    with contextlib.ExitStack() as stack:
        if nginx or daphnes > 1:
            import psutil

            from tests.cluster.nginx import start_nginx

            server = stack.enter_context(start_nginx([f"127.0.0.1:{p}" for p in ports]))
            pids["nginx"] = [c.pid for c in psutil.Process(server.pid).children()]  # the master only supervises
            url = f"{server.ws_url}/v1/realtime"
        else:
            url = f"ws://127.0.0.1:{ports[0]}/v1/realtime"
        yield Topology(url, keys, pids, var_dir / "recordings" / "raw", var_dir, env)


def service_log_tail(var_dir: Path, chars: int = 4000) -> dict[str, str]:
    """The end of every process's log, for the results when something failed."""
    out = {}
    for log in sorted((var_dir / "logs").glob("*.log")):
        text = log.read_text(errors="replace")
        out[log.stem] = text[-chars:]
    return out


def error_lines(var_dir: Path, blocks: int = 3) -> dict[str, dict]:
    """Per process log: how many records name an error, and the first ``blocks`` of them whole (tracebacks)."""
    out: dict[str, dict] = {}
    header = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
    for log in sorted((var_dir / "logs").glob("*.log")):
        records: list[list[str]] = []
        for line in log.read_text(errors="replace").splitlines():
            if header.match(line) or not records:
                records.append([line])
            else:
                records[-1].append(line)
        bad = [r for r in records if "ERROR" in r[0] or "Traceback" in "\n".join(r) or "CRITICAL" in r[0]]
        if bad:
            out[log.stem] = {
                "records": len(bad),
                "first": ["\n".join(r)[-3000:] for r in bad[:blocks]],
                "kinds": sorted({r[0][24:200] for r in bad})[:10],
            }
    return out


def cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def rss_mb(pids: list[int]) -> float:
    import psutil

    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return total / 2**20


RENDER_SCRIPT = """
import json
from webapp.recordings.models import Recording
from webapp.recordings.tasks import process_recording
out = {{}}
for sid in json.loads({sids!r}):
    row = Recording.objects.filter(session_id=sid).first()
    if row is None:
        out[sid] = {{"status": "missing"}}
        continue
    process_recording(row.pk)
    row.refresh_from_db()
    out[sid] = {{"status": row.status, "duration_s": row.duration_s, "reason": row.status_reason[:200]}}
print("RENDERED=" + json.dumps(out))
"""


def render_recordings(var_dir: Path, env: dict[str, str], session_ids: list[str]) -> dict[str, dict]:
    """Post-process these sessions' recordings as the Celery task does; their rows' status and duration."""
    import json

    env = {**env, "CELERY_BROKER_URL": ""}  # eager: the task runs in this shell
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", RENDER_SCRIPT.format(sids=json.dumps(session_ids))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("RENDERED=")), None)
    if line is None:
        return {"error": {"status": "render failed", "reason": out.stderr[-1500:]}}
    return json.loads(line.removeprefix("RENDERED="))
