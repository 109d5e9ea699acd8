"""Fixtures shared by every suite: the in-process inference service and a daphne live server.

The live server runs daphne in a child process (channels' ``DaphneProcess``), which is why the
test database is a file (see ``webapp/settings/test.py``). Browser tests (``tests/browser/``) and
pytest-asyncio tests must run in separate pytest invocations (stack-notes §4).
"""

from __future__ import annotations

import inspect
from functools import partial
from types import SimpleNamespace

import pytest
from django.conf import settings

from inference import api

# Larger than the endpoint's own limit, so oversized events reach the consumer and get event_too_large.
LIVE_SERVER_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


@pytest.fixture(scope="session", autouse=True)
def _var_dir():
    settings.VAR_DIR.mkdir(parents=True, exist_ok=True)


@pytest.fixture
async def inference_service():
    """Start the in-process inference service on this test's event loop; returns a restarter.

    ``await inference_service(slots=1, queue_max=1)`` restarts it with config overrides. The
    service is shut down after the test, so no session leaks into the next one.
    """

    async def start(**overrides):
        result = api.start(engine="echo", **overrides)
        if inspect.isawaitable(result):
            await result

    await start()
    yield start
    await api.shutdown()


def _live_server_child_setup(database_name: str) -> None:
    """Runs in the forked daphne child before it serves.

    Threads do not survive a fork: asgiref's thread-sensitive executor, if the parent already used
    it (any earlier ``database_sync_to_async`` in this pytest run), would wait forever on a worker
    that does not exist in the child. Give the child a fresh one, then point it at the database the
    parent's tests use (the name it really opened, not a TEST setting that may have changed since).
    """
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import SyncToAsync
    from django.conf import settings

    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)
    # New connections (one per executor thread) are made from settings.DATABASES. The inherited
    # main-thread connection is left alone: closing it would close the parent's socket too.
    settings.DATABASES["default"]["NAME"] = database_name


@pytest.fixture(scope="session")
def channels_live_server(django_db_setup, django_db_blocker):
    """daphne serving ``webapp.asgi`` in a child process on a free port; yields ``url`` and ``ws_url``.

    Rows that the server must see are written by tests marked ``django_db(transaction=True)``.
    """
    from channels.testing.live import make_application
    from daphne.testing import DaphneProcess
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
    from django.db import connection

    proc = DaphneProcess(
        "127.0.0.1",
        partial(make_application, static_wrapper=ASGIStaticFilesHandler),
        kwargs={
            "websocket_max_message_size": LIVE_SERVER_MAX_MESSAGE_BYTES,
            "websocket_max_frame_size": LIVE_SERVER_MAX_MESSAGE_BYTES,
        },
        setup=partial(_live_server_child_setup, connection.settings_dict["NAME"]),
    )
    with django_db_blocker.unblock():  # the forked child inherits the unblocked state
        proc.start()
    if not proc.ready.wait(timeout=20):
        proc.terminate()
        proc.join(timeout=5)
        raise RuntimeError("the daphne live server did not start within 20 s")
    port = proc.port.value
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}", ws_url=f"ws://127.0.0.1:{port}", host=f"127.0.0.1:{port}")
    proc.terminate()
    proc.join(timeout=10)
