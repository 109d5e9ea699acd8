"""The production path: the realtime consumer on the Redis channel layer and PostgreSQL.

Settings are read once per process, so the test re-runs a slice of the consumer suite (and the SDK
test against the live server) in a child pytest with ``DATABASE_URL`` and ``REDIS_URL`` pointing at
the suite's own throwaway servers (tests/services.py), so it runs on any machine and never touches
servers the machine happens to run. ``child_checks.py`` runs first inside that child and proves the
services really are in use there.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[3]
SLICE = [
    str(Path(__file__).with_name("child_checks.py").relative_to(ROOT)),
    "tests/webapp/realtime/test_audio.py::test_base64_round_trip_and_response_lifecycle",
    "tests/webapp/realtime/test_lifecycle.py",
    "tests/webapp/realtime/test_errors.py::test_session_not_ready_while_queued_then_resource_exhausted",
    "tests/webapp/realtime/test_bad_input_properties.py",  # NUL and surrogates meet PostgreSQL's own checks
    "tests/sdk/test_openai_realtime.py",
]


def test_consumer_suite_on_redis_and_postgres(postgres_server, redis_server):
    env = {**os.environ, "DATABASE_URL": postgres_server.url, "REDIS_URL": redis_server.url}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-o", "addopts=", *SLICE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    tail = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, tail
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and " skipped" not in summary, tail
    assert "child_checks.py::test_the_services_are_in_use PASSED" in result.stdout, tail
