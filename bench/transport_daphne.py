"""The web tier bench/transport.py's ``--via ws`` talks to: daphne on 127.0.0.1 over the echo engine, in a
temporary var dir with its own SQLite DB, one user and API key per bench client."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def django_env(var_dir: Path, clients: int, delay_frames: int) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "webapp.settings.local",
        "PARLEY_VAR_DIR": str(var_dir),
        "PARLEY_ENGINE": "echo",
        "PARLEY_SLOTS": str(clients),
        "PARLEY_QUEUE_MAX": "0",
        "PARLEY_ECHO_DELAY_FRAMES": str(delay_frames),
        "PARLEY_INPUT_QUEUE_FRAMES": "16",
        "PARLEY_CONNECT_RATE": "100000/minute",  # every bench client connects from 127.0.0.1
    }
    for name in ("PARLEY_INFERENCE_URL", "DATABASE_URL"):
        env.pop(name, None)
    return env


SETUP_SCRIPT = """
import json
from django.contrib.auth import get_user_model
from webapp.accounts.services import apikey_create
keys = []
for i in range({clients}):
    user, _ = get_user_model().objects.get_or_create(username=f"bench{{i}}")
    keys.append(apikey_create(user=user, name="bench/transport.py")[1])
print("KEYS=" + json.dumps(keys))
"""


def create_keys(env: dict[str, str], clients: int) -> list[str]:
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    out = subprocess.run(
        [python, "manage.py", "shell", "-c", SETUP_SCRIPT.format(clients=clients)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return keys_printed(out)


def keys_printed(out: str) -> list[str]:
    """The API keys ``SETUP_SCRIPT`` printed (its ``KEYS=`` line) in a shell's output."""
    line = next(line for line in out.splitlines() if line.startswith("KEYS="))
    return json.loads(line.removeprefix("KEYS="))


def wait_for_port(port: int, proc: subprocess.Popen, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"daphne exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit("daphne did not start listening in time")


def start_daphne(args, var_dir: Path) -> tuple[subprocess.Popen, str, list[str]]:
    """Migrate a fresh SQLite DB, create the users and keys, start daphne; returns (process, url, keys)."""
    env = django_env(var_dir, args.clients, args.delay_frames)
    keys = create_keys(env, args.clients)
    port = free_port()
    daphne = str(Path(sys.executable).with_name("daphne"))
    proc = subprocess.Popen(
        [daphne, "-b", "127.0.0.1", "-p", str(port), "webapp.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(port, proc)
    return proc, f"ws://127.0.0.1:{port}/v1/realtime", keys
