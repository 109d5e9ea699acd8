"""The production path: the realtime consumer on the Redis channel layer and PostgreSQL.

Settings are read once per process, so the outer test re-runs a slice of the consumer suite (and
the SDK test against the live server) in a child pytest with ``DATABASE_URL`` and ``REDIS_URL``
set; the inner test checks, inside that child, that the services really are in use. Skipped
cleanly when the servers are unreachable. Override the addresses with PARLEY_TEST_DATABASE_URL /
PARLEY_TEST_REDIS_URL.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[3]
DATABASE_URL = os.environ.get("PARLEY_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("PARLEY_TEST_REDIS_URL", "redis://127.0.0.1:6379/2")
CHILD_FLAG = "PARLEY_SERVICES_CHILD"
SLICE = [
    f"{Path(__file__).relative_to(ROOT)}::test_inside_the_child_the_services_are_in_use",
    "tests/webapp/realtime/test_audio.py::test_base64_round_trip_and_response_lifecycle",
    "tests/webapp/realtime/test_lifecycle.py",
    "tests/webapp/realtime/test_errors.py::test_session_not_ready_while_queued_then_resource_exhausted",
    "tests/sdk/test_openai_realtime.py",
]


def reachable(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=1):
            return True
    except OSError:
        return False


def test_consumer_suite_on_redis_and_postgres():
    if os.environ.get(CHILD_FLAG):
        pytest.skip("this is the child run")
    for url in (DATABASE_URL, REDIS_URL):
        if not reachable(url):
            pytest.skip(f"{urlparse(url).scheme} server not reachable at {urlparse(url).netloc}")
    env = {**os.environ, "DATABASE_URL": DATABASE_URL, "REDIS_URL": REDIS_URL, CHILD_FLAG: "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=", *SLICE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    tail = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, tail
    assert " skipped" not in result.stdout.splitlines()[-1], tail  # the inner check really ran


@pytest.mark.django_db(transaction=True)
async def test_inside_the_child_the_services_are_in_use():
    if not os.environ.get(CHILD_FLAG):
        pytest.skip("runs inside the child of test_consumer_suite_on_redis_and_postgres")
    from channels.layers import get_channel_layer
    from channels_redis.core import RedisChannelLayer
    from django.db import connection

    assert connection.vendor == "postgresql"
    layer = get_channel_layer()
    assert isinstance(layer, RedisChannelLayer)
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "probe", "frame": "x" * 7680})
    assert (await layer.receive(channel))["frame"] == "x" * 7680
