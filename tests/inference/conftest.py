"""Fixtures for the inference service tests (helpers live in ``event_helpers.py``)."""

from __future__ import annotations

import pytest

from inference import api


@pytest.fixture
async def facade():
    """``await facade(**overrides)`` (re)starts the in-process service; it is shut down after the test."""

    async def start(**overrides):
        await api.start(**{"engine": "echo", **overrides})

    yield start
    await api.shutdown()
