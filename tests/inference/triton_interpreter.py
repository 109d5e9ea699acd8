"""Run a script of kernel checks in Triton's CPU interpreter, in a child process.

The interpreter needs ``TRITON_INTERPRET=1`` before Triton is imported, which a test process that imported it
already cannot undo. The script prints ``ok`` last when every check passed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed")


def run_interpreted(checks: str, timeout: float = 600) -> None:
    """Run ``checks`` (Python source) with the interpreter on; fail the test with its stderr otherwise."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", checks], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
