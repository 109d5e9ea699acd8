"""Moshi LM tests run torch single-threaded: the tiny models are latency bound, and on a shared 2-core
machine intra-op threads spin against other processes (SDPA was 300x slower with 2 threads under load)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
