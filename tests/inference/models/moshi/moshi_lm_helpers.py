"""Fixtures for the Moshi / PersonaPlex LM tests: tiny random checkpoints and the reference runner."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from inference.models.moshi.make_checkpoint import PRESETS, write_lm_checkpoint

ROOT = Path(__file__).resolve().parents[4]
REF_PYTHON = ROOT / ".venv-moshi-ref" / "bin" / "python"
REF_RUNNER = Path(__file__).with_name("ref_runner.py")
PERSONAPLEX_DATA = ROOT / "tests" / "data" / "personaplex"


def make_lm_dir(path: Path, seed: int, **overrides) -> Path:
    """An LM-only checkpoint dir (config.json + model.safetensors; empty mimi config and tokenizer)."""
    kwargs = dict(PRESETS["tiny-moshiko"])
    kwargs.update(overrides)
    write_lm_checkpoint(path, kwargs, seed)
    (path / "mimi_config.json").write_text("{}")
    (path / "tokenizer.model").write_bytes(b"")
    return path


def user_codes(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Non-trivial user codes: random runs of repeated codes mixed with uniform noise, in 0..2047."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2048, size=shape)
    hold = rng.random(shape) < 0.3  # some frames repeat the previous one, as real speech codes do
    for t in range(1, shape[-1]):
        codes[..., t] = np.where(hold[..., t], codes[..., t - 1], codes[..., t])
    return codes.astype(np.int64)


def run_reference(ckpt: Path, codes: np.ndarray, tmp: Path) -> np.ndarray:
    """Greedy tokens of moshi 0.2.13's LMGen on ``ckpt`` for ``codes``, computed in .venv-moshi-ref."""
    if not REF_PYTHON.exists():
        pytest.skip(".venv-moshi-ref is not installed (the CI test command installs it)")
    codes_path, out_path = tmp / "ref_codes.npy", tmp / "ref_out.npy"
    np.save(codes_path, codes)
    env = dict(os.environ, NO_TORCH_COMPILE="1", OMP_NUM_THREADS="1")
    subprocess.run(
        [str(REF_PYTHON), str(REF_RUNNER), str(ckpt), str(codes_path), str(out_path)],
        check=True,
        env=env,
        timeout=300,
    )
    return np.load(out_path)
