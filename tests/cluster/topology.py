"""The whole production topology on loopback: what ``make cluster`` runs and the cluster test drives.

PostgreSQL and Redis (``tests/services.py``; Redis requires a password, which every process's
``REDIS_URL`` / ``PARLEY_REGISTRY_URL`` / ``CELERY_BROKER_URL`` carries), N inference services on
TCP (echo engine) that heartbeat into the Redis registry, M daphne processes behind nginx
(``tests/cluster/nginx.py``), and a Celery worker and beat on the Redis broker. Every piece is a
child process with its output in ``<var>/logs/``; ``Cluster`` stops them in reverse order (SIGTERM,
then SIGKILL after a grace) and deletes its files. docs/deploy.md maps each piece to its systemd
unit for a real deployment.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.nginx import NginxServer, start_nginx
from tests.services import HOST, ServiceError, free_port, start_postgres, start_redis

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(Path(sys.executable))
DAPHNE = str(Path(sys.executable).with_name("daphne"))
CELERY = str(Path(sys.executable).with_name("celery"))
STOP_GRACE_S = 10.0
START_TIMEOUT_S = 120.0  # two shared cores under other work: a daphne import of Django can take a minute


@dataclass
class Process:
    name: str
    command: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen | None = None

    def start(self) -> None:
        guard = ["setpriv", "--pdeathsig=TERM", "--"] if shutil.which("setpriv") else []
        handle = self.log.open("ab")
        self.popen = subprocess.Popen(
            [*guard, *self.command], cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT
        )
        handle.close()

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int | None:
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass
class ServiceSlot:
    """One inference service: its id, TCP port and metrics port stay the same across restarts."""

    service_id: str
    port: int
    metrics_port: int
    process: Process | None = None


@dataclass
class Cluster:
    """Start with ``with Cluster() as cluster:``; everything stops when the block ends."""

    services: int = 2
    daphnes: int = 2
    slots: int = 4
    heartbeat_s: float = 0.5
    heartbeat_timeout_s: float = 2.5
    celery: bool = True
    # Worker processes: one (the solo pool) keeps start-up light for the placement tests, whose 0.5 s heartbeats
    # went stale under load; the load test takes two, as deploy/systemd/parley-celery-worker.service runs, for
    # its 40 recordings (about 5.5 s of CPU each: caller transcript 3.5 s, Opus encoding 0.8-1.5 s).
    celery_workers: int = 1
    postgres: bool = True  # False: one SQLite file shared by the web processes (a host without PostgreSQL)
    nginx_port: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)  # PARLEY_* and friends for every process
    var_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="parley-cluster-")))
    env: dict[str, str] = field(default_factory=dict)
    service_slots: list[ServiceSlot] = field(default_factory=list)
    daphne_urls: list[str] = field(default_factory=list)
    nginx: NginxServer | None = None
    redis_url: str = ""
    database_url: str = ""
    processes: list[Process] = field(default_factory=list)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    # ---- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        (self.var_dir / "logs").mkdir(parents=True, exist_ok=True)
        if self.postgres:
            self.database_url = self._stack.enter_context(start_postgres()).url
        # A password-less Redis would let any local process forge registry records and read the channel layer.
        redis = self._stack.enter_context(start_redis(password=secrets.token_urlsafe(24)))
        self.redis_url = redis.url
        self.env = self._base_env(redis)
        self._run_once("migrate", [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"])
        for i in range(self.services):
            slot = ServiceSlot(f"svc-{chr(ord('a') + i)}", free_port(), free_port())
            self.service_slots.append(slot)
            self.start_service(slot.service_id, wait=False)
        ports = [free_port() for _ in range(self.daphnes)]
        for i, port in enumerate(ports):
            self._spawn(f"daphne-{i + 1}", [DAPHNE, "-b", HOST, "-p", str(port), "webapp.asgi:application"])
        if self.celery:
            pool = ["--pool=solo"] if self.celery_workers == 1 else ["--concurrency", str(self.celery_workers)]
            self._spawn("celery-worker", [CELERY, "-A", "webapp", "worker", *pool,
                                          "--without-gossip", "--without-mingle", "-l", "info"])  # fmt: skip
            schedule = str(self.var_dir / "celerybeat-schedule")
            self._spawn("celery-beat", [CELERY, "-A", "webapp", "beat", "-s", schedule, "-l", "info"])
        for port in ports:
            self._wait_for_port(port, f"daphne on {port}")
        self.daphne_urls = [f"http://{HOST}:{port}" for port in ports]
        self.nginx = self._stack.enter_context(start_nginx([f"{HOST}:{p}" for p in ports], self.nginx_port))
        for slot in self.service_slots:
            self.wait_for_service(slot.service_id, "serving")

    def close(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        self._stack.close()
        shutil.rmtree(self.var_dir, ignore_errors=True)

    # ---- inference services -------------------------------------------------------------------------

    def start_service(self, service_id: str, *, wait: bool = True) -> None:
        slot = self._slot(service_id)
        command = [PYTHON, "-m", "inference", "serve", "--tcp", f"{HOST}:{slot.port}", "--service-id", service_id,
                   "--metrics-port", str(slot.metrics_port), "--socket", str(self.var_dir / f"{service_id}.sock")]  # fmt: skip
        slot.process = self._spawn(service_id, command)
        if wait:
            self.wait_for_service(service_id, "serving")

    def kill_service(self, service_id: str) -> None:
        """SIGKILL: the service gets no chance to say goodbye; only its missing heartbeats tell."""
        process = self._slot(service_id).process
        assert process is not None and process.popen is not None
        process.popen.kill()
        process.popen.wait(5)

    def registry(self) -> dict[str, dict]:
        """service_id -> the raw registry record (as the web tier reads it)."""
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            raw = client.hgetall("parley:services")
        finally:
            client.close()
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def wait_for_service(self, service_id: str, state: str, within_s: float = START_TIMEOUT_S) -> dict:
        """Wait until the registry shows ``service_id`` serving (a fresh heartbeat) or down (a stale one)."""
        deadline = time.monotonic() + within_s
        record = None
        while time.monotonic() < deadline:
            record = self.registry().get(service_id)
            fresh = record is not None and time.time() - record["heartbeat_at"] <= self.heartbeat_timeout_s
            if (state == "down" and not fresh) or (state != "down" and fresh and record["state"] == state):
                return record or {}
            process = self._slot(service_id).process
            if state != "down" and process is not None and not process.alive:
                raise ServiceError(f"{service_id} exited: {process.tail()}")
            time.sleep(0.1)
        raise ServiceError(f"{service_id} not {state} within {within_s:g} s (last record: {record})")

    def metrics(self, service_id: str) -> str:
        port = self._slot(service_id).metrics_port
        with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as response:
            return response.read().decode()

    # ---- helpers ----------------------------------------------------------------------------------

    def manage(self, *args: str) -> str:
        """Run ``manage.py`` with the cluster's settings; returns its stdout."""
        return self._run_once("manage", [PYTHON, "manage.py", *args])

    def _base_env(self, redis) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PARLEY_", "DJANGO_", "CELERY_"))}
        token_file = self.var_dir / "inference-token"
        token_file.write_text(secrets.token_urlsafe(32))
        token_file.chmod(0o600)
        return (
            env
            | {
                "PYTHONPATH": str(ROOT),
                # The loopback cluster serves plain HTTP with the local settings (static files from daphne);
                # a real deployment runs webapp.settings.production behind TLS (docs/deploy.md).
                "DJANGO_SETTINGS_MODULE": "webapp.settings.local",
                "PARLEY_VAR_DIR": str(self.var_dir),
                "DATABASE_URL": self.database_url,  # "" means SQLite in PARLEY_VAR_DIR
                "REDIS_URL": redis.url,
                "CELERY_BROKER_URL": redis.database_url(1),
                "PARLEY_REGISTRY_URL": redis.url,
                "PARLEY_INFERENCE_TOKEN": token_file.read_text(),
                "PARLEY_ENGINE": "echo",
                "PARLEY_SLOTS": str(self.slots),
                "PARLEY_HEARTBEAT_S": str(self.heartbeat_s),
                "PARLEY_HEARTBEAT_TIMEOUT_S": str(self.heartbeat_timeout_s),
                "PARLEY_RECORDINGS_DIR": str(self.var_dir / "recordings" / "raw"),
                # a web process's own load limit would turn callers away whenever the suite keeps the machine busy;
                # it has its own test (tests/webapp/realtime/test_loop_load.py)
                "PARLEY_WEB_LOOP_LAG_MS": "0",
            }
            | self.extra_env
        )

    def _slot(self, service_id: str) -> ServiceSlot:
        return next(s for s in self.service_slots if s.service_id == service_id)

    def _spawn(self, name: str, command: list[str]) -> Process:
        process = Process(name, command, self.env, self.var_dir / "logs" / f"{name}.log")
        process.start()
        self.processes.append(process)
        return process

    def _run_once(self, name: str, command: list[str]) -> str:
        result = subprocess.run(command, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise ServiceError(f"{' '.join(command[1:3])} failed: {result.stderr[-3000:]}")
        return result.stdout

    def _wait_for_port(self, port: int, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex((HOST, port)) == 0:
                    return
            dead = [p for p in self.processes if not p.alive]
            if dead:
                raise ServiceError(f"{dead[0].name} exited: {dead[0].tail()}")
            time.sleep(0.2)
        raise ServiceError(f"{what} did not listen within {START_TIMEOUT_S:g} s")
