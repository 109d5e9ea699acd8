"""A real ``python -m inference serve`` process on a unix socket, for tests that need the separate service."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def start_inference_service(socket_path: str, **env: str) -> tuple[subprocess.Popen, list[str]]:
    """Start the service with ``env`` over this process's environment; return it and its lines up to ``ready:``."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    full_env.pop("PARLEY_INFERENCE_URL", None)  # the service under test is this one, not the caller's
    proc = subprocess.Popen(
        [sys.executable, "-m", "inference", "serve", "--socket", socket_path],
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("ready:"):
            return proc, lines
    proc.wait(5)
    pytest.fail("the service never said ready:\n" + "".join(lines))
