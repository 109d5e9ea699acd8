"""Moshi LM tests run torch single-threaded: the tiny models are latency bound, and on a shared 2-core
machine intra-op threads spin against other processes (SDPA was 300x slower with 2 threads under load)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_thread(single_torch_thread):
    """Every test here runs torch on one thread (``single_torch_thread``, tests/conftest.py)."""
