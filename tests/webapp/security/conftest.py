"""Fixtures of the security tests (issue 16)."""

import pytest

from tests.webapp.realtime.realtime_helpers import Account, make_account


@pytest.fixture
async def alice(inference_service) -> Account:
    """A user with an API key, and the echo inference service running."""
    return await make_account("alice")
