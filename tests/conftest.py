"""Fixtures shared by every suite: the in-process inference service and a daphne live server.

The live server runs daphne in a child process (channels' ``DaphneProcess``), which is why the
test database is a file (see ``webapp/settings/test.py``). Browser tests (``tests/browser/``) and
pytest-asyncio tests must run in separate pytest invocations (stack-notes §4).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from django.conf import settings

from inference import api
from tests import services
from tests.ci_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401 (hooks: under CI a skip fails)
from tests.live_server import run_live_server


@pytest.fixture(scope="session", autouse=True)
def _var_dir():
    settings.VAR_DIR.mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="session", autouse=True)
def _recordings_dir(tmp_path_factory):
    """Sessions are recorded by default: the suite's raw recordings go to a temp folder, not var/."""
    os.environ.setdefault("PARLEY_RECORDINGS_DIR", str(tmp_path_factory.mktemp("raw-recordings")))


@pytest.fixture(scope="session", autouse=True)
def _no_time_limited_admission():
    """The suite's engines tick on a shared 2-core CPU that the suite itself loads: admission's time limit
    (``PARLEY_TICK_BUDGET``) would queue a test's callers whenever a neighbour test is busy. It is off for every
    service the suite starts (they inherit this environment) and tested where it is the subject
    (tests/inference/slots/test_pool_admission.py)."""
    os.environ.setdefault("PARLEY_TICK_BUDGET", "0")


@pytest.fixture
def single_torch_thread():
    """Torch on one intra-op thread for the test, then as before. The tiny models are latency bound: on the
    shared 2-core machine extra threads only spin against other processes (SDPA was 300x slower with two
    threads under load), and one thread keeps BLAS reductions deterministic. Torch is imported only here,
    so a web-tier test that does not ask for it never loads torch."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
async def inference_service():
    """Start the in-process inference service on this test's event loop; returns a restarter.

    ``await inference_service(slots=1, queue_max=1)`` restarts it with config overrides. The
    service is shut down after the test, so no session leaks into the next one.
    """

    async def start(**overrides):
        await api.start(engine="echo", **overrides)

    await start()
    yield start
    await api.shutdown()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[services.RedisServer]:
    """A throwaway redis-server for the whole run (``.url``); see tests/services.py."""
    with services.start_redis() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[services.PostgresServer]:
    """A throwaway PostgreSQL cluster for the whole run (``.url`` of a fresh database); see tests/services.py."""
    with services.start_postgres() as server:
        yield server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[services.S3Server]:
    """A throwaway S3-compatible server with an empty bucket for the whole run; see tests/services.py."""
    with services.start_s3() as server:
        yield server


@pytest.fixture(scope="session")
def channels_live_server(django_db_setup, django_db_blocker):
    """daphne serving ``webapp.asgi`` in a child process on a free port; yields ``url`` and ``ws_url``.

    Rows that the server must see are written by tests marked ``django_db(transaction=True)``.
    """
    with run_live_server(django_db_blocker) as server:
        yield server
