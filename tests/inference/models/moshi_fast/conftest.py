"""The tiny PersonaPlex pack every fast-path CPU test runs on: its checkpoint info and float32 model."""

from __future__ import annotations

import pytest

from inference.models.moshi.config import read_checkpoint_dir
from inference.models.moshi.loading import load_lm
from tests.inference.models.moshi_fast.tiny_pack import DATA


@pytest.fixture(scope="module")
def tiny():
    info = read_checkpoint_dir(DATA / "ckpt")
    return info, load_lm(info.moshi_weights, info.lm)
