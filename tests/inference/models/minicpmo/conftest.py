"""Fixtures for the MiniCPM-o tests: the tiny checkpoint is regenerated once per session by our own fill."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA_DIR = Path(__file__).resolve().parents[3] / "data" / "minicpmo45"


@pytest.fixture(scope="session")
def minicpmo_data_dir() -> Path:
    """The golden pack's data files copied into the repo (config, keys, tokenizer, scenarios)."""
    return DATA_DIR


@pytest.fixture(scope="session")
def minicpmo_checkpoint(tmp_path_factory) -> Path:
    """A complete tiny checkpoint directory, seed 1234 (the goldens' weights)."""
    from inference.models.minicpmo.fill import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("minicpmo-ckpt"), data_dir=DATA_DIR, seed=1234)


@pytest.fixture(scope="session")
def minicpmo_parts(minicpmo_checkpoint):
    """The loaded tiny model (float32, CPU), shared by the tests that only read it."""
    import torch

    from inference.models.minicpmo.loading import load_model

    torch.set_grad_enabled(False)
    return load_model(minicpmo_checkpoint)
