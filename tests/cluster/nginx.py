"""A throwaway nginx in front of daphne processes, from ``deploy/nginx.conf.template``.

Like ``tests/services.py``'s servers: a child process on a loopback port, its files in a temporary
directory, stopped (SIGQUIT: graceful) and removed on exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.services import HOST, ServiceError, free_port

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy" / "nginx.conf.template"
START_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class NginxServer:
    url: str  # http://127.0.0.1:PORT
    ws_url: str
    port: int
    config: Path
    pid: int  # the master process


def render_config(*, listen: str, upstreams: list[str], run_dir: Path) -> str:
    """The template with its placeholders filled; ``upstreams`` are ``host:port`` of the daphne processes."""
    # Workers drop to an unprivileged user under root; that user must write the temp folders.
    user = "user nobody nogroup;" if os.geteuid() == 0 else ""
    servers = "\n".join(f"        server {u} max_fails=3 fail_timeout=5s;" for u in upstreams)
    text = TEMPLATE.read_text()
    for name, value in (("USER", user), ("RUN_DIR", str(run_dir)), ("UPSTREAMS", servers), ("LISTEN", listen)):
        text = text.replace(f"@@{name}@@", value)
    return text


@contextlib.contextmanager
def start_nginx(upstreams: list[str], port: int | None = None) -> Iterator[NginxServer]:
    """nginx on a loopback port proxying HTTP and WebSockets to ``upstreams`` (round robin)."""
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        raise ServiceError("nginx is not installed: apt-get install nginx (scripts/install-system.sh test)")
    run_dir = Path(tempfile.mkdtemp(prefix="parley-nginx-"))
    os.chmod(run_dir, 0o755)  # workers run as nobody and write their temp folders here
    port = port or free_port()
    config = run_dir / "nginx.conf"
    config.write_text(render_config(listen=f"{HOST}:{port}", upstreams=upstreams, run_dir=run_dir))
    if os.geteuid() == 0:
        for folder in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (run_dir / folder).mkdir()
            shutil.chown(run_dir / folder, "nobody", "nogroup")
    guard = ["setpriv", "--pdeathsig=TERM", "--"] if shutil.which("setpriv") else []
    command = [*guard, binary, "-p", str(run_dir), "-c", str(config), "-e", str(run_dir / "error.log"),
               "-g", "daemon off;"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(process, port, run_dir)
        yield NginxServer(
            url=f"http://{HOST}:{port}", ws_url=f"ws://{HOST}:{port}", port=port, config=config, pid=process.pid
        )
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGQUIT)  # graceful: finish open requests, then exit
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        shutil.rmtree(run_dir, ignore_errors=True)


def _wait_for_port(process: subprocess.Popen, port: int, run_dir: Path) -> None:
    import socket

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = (run_dir / "error.log").read_text() if (run_dir / "error.log").exists() else ""
            raise ServiceError(f"nginx exited with {process.returncode}: {log[-2000:]}")
        with socket.socket() as probe:
            if probe.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.1)
    raise ServiceError(f"nginx did not listen on {port} within {START_TIMEOUT_S:g} s")
