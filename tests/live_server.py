"""A daphne live server in a forked child process, for tests that need a real socket (browser, SDK).

The test database is a file (``webapp/settings/test.py``) so the child sees the rows tests write.
The child's inference service reads ``PARLEY_*`` at start, so each server gets its environment
set around the fork only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

# Larger than the endpoint's own limit, so oversized events reach the consumer and get event_too_large.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
START_TIMEOUT_S = 30
MINICPMO_DATA = Path(__file__).resolve().parent / "data" / "minicpmo45"


def live_server_env(engine: str, checkpoint: str = "", **extra: str) -> dict[str, str]:
    """``PARLEY_*`` for a live server's inference service, which runs inside the server process.

    Two slots; a short grace frees slots of tests that failed half-way before the next test. An
    empty checkpoint or inference URL counts as unset: a developer's shell must not leak in.
    """
    return {
        "PARLEY_ENGINE": engine,
        "PARLEY_CHECKPOINT": checkpoint,
        "PARLEY_INFERENCE_URL": "",
        "PARLEY_SLOTS": "2",
        "PARLEY_DISCONNECT_GRACE_S": "10",
        **extra,
    }


def _child_setup(database_name: str) -> None:
    """Runs in the forked daphne child before it serves.

    Threads do not survive a fork: asgiref's thread-sensitive executor, if the parent already used
    it (any earlier ``database_sync_to_async`` in this pytest run), would wait forever on a worker
    that does not exist in the child. Give the child a fresh one, then point it at the database the
    parent's tests use (the name it really opened, not a TEST setting that may have changed since).
    """
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import SyncToAsync
    from django.conf import settings

    from inference import embedded

    # An inference service (and its config) an earlier test made in the parent would answer in the
    # child with the parent's engine, whatever env this server was started with.
    embedded.forget_inherited_service()
    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)
    # New connections (one per executor thread) are made from settings.DATABASES. The inherited
    # main-thread connection is left alone: closing it would close the parent's socket too.
    settings.DATABASES["default"]["NAME"] = database_name


@contextlib.contextmanager
def run_live_server(django_db_blocker, env: Mapping[str, str] | None = None) -> Iterator[SimpleNamespace]:
    """Start daphne serving ``webapp.asgi`` on a free port; yields ``url``, ``ws_url`` and ``host``."""
    from channels.testing.live import make_application
    from daphne.testing import DaphneProcess
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
    from django.db import connection

    proc = DaphneProcess(
        "127.0.0.1",
        partial(make_application, static_wrapper=ASGIStaticFilesHandler),
        kwargs={"websocket_max_message_size": MAX_MESSAGE_BYTES, "websocket_max_frame_size": MAX_MESSAGE_BYTES},
        setup=partial(_child_setup, connection.settings_dict["NAME"]),
    )
    # The child reads ``env`` at the fork; this process's environment is restored right after.
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        # The child inherits pytest-django's database blocker: forked while blocked, every query
        # in the server fails. Unblock around the fork only.
        with django_db_blocker.unblock():
            proc.start()
    try:
        if not proc.ready.wait(timeout=START_TIMEOUT_S):
            raise RuntimeError(f"the daphne live server did not start within {START_TIMEOUT_S} s")
        port = proc.port.value
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}", ws_url=f"ws://127.0.0.1:{port}", host=f"127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.join(timeout=10)


@contextlib.contextmanager
def run_unit_live_server(
    tmp_path_factory, django_db_blocker, *, vocoder: bool = True, **extra_env: str
) -> Iterator[SimpleNamespace]:
    """A live server whose inference service runs the unit engine on a fresh tiny MiniCPM-o checkpoint.

    ``vocoder``: with tiny random Token2Wav assets inside the checkpoint (the agent speaks noise); without,
    the engine's audio is silence of the right length.
    """
    from inference.models.minicpmo.fill import make_checkpoint
    from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets

    checkpoint = make_checkpoint(tmp_path_factory.mktemp("minicpmo-live"), data_dir=MINICPMO_DATA)
    if vocoder:
        make_token2wav_assets(checkpoint / "assets" / "token2wav")
    with run_live_server(django_db_blocker, live_server_env("minicpmo", str(checkpoint), **extra_env)) as server:
        yield server
