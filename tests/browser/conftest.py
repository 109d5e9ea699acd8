"""Browser tests: Debian chromium through pytest-playwright, a fake microphone, a daphne live server.

Run them in their own pytest invocation (``pytest -m browser tests/browser``): once
pytest-playwright's sync Playwright runs, pytest-asyncio tests in the same process fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission

from tests.live_server import live_server_env, run_live_server

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Words long enough that the looping fake microphone is mostly speech, with natural short gaps.
FAKE_MIC_TEXT = "hello, how are you today? I would like to talk about the weather and the news."


@pytest.fixture(scope="session", autouse=True)
def _allow_orm_under_playwright() -> Iterator[None]:
    # Playwright's sync API keeps an event loop running in the main thread, so Django's async
    # safety check would reject the ORM calls these tests make (creating users, flushing tables).
    # Set here rather than at import, so unit runs that merely collect this folder are unaffected.
    # (MonkeyPatch.context: the session-scoped fixture cannot take the function-scoped monkeypatch.)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="session")
def fake_mic_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Speech for chromium's fake microphone, made with espeak-ng and sox (never committed)."""
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install espeak-ng sox)")
    folder = tmp_path_factory.mktemp("fake-mic")
    speech = folder / "speech.wav"
    mic = folder / "fake_mic.wav"
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(speech), FAKE_MIC_TEXT], check=True, timeout=60)
    # 48 kHz mono 16-bit is what a real microphone delivers; the page must resample it itself.
    subprocess.run(["sox", str(speech), "-r", "48000", "-c", "1", "-b", "16", str(mic)], check=True, timeout=60)
    return mic


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict, fake_mic_wav: Path) -> dict:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"chromium not found at {CHROMIUM} (apt-get install chromium, or set CHROMIUM)")
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "headless": True,
        "args": [
            *browser_type_launch_args.get("args", []),
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={fake_mic_wav}",
            "--autoplay-policy=no-user-gesture-required",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    }


@pytest.fixture(scope="module")
def browser(browser_type, browser_type_launch_args):
    """One chromium per test file (pytest-playwright's lives for the whole run). The browser files run in a few
    pytest processes (scripts/test.sh): a page a file leaves open, a call still running on it, dies with the
    file's chromium instead of loading the machine for every file after it."""
    browser = browser_type.launch(**browser_type_launch_args)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def launch_with_fake_mic(browser_type, browser_type_launch_args):
    """``launch(wav)``: a chromium of the test file's own whose fake microphone plays ``wav`` (the shared one
    plays the suite's speech); each is closed with the file."""
    launched = []
    others = [a for a in browser_type_launch_args["args"] if not a.startswith("--use-file-for-fake-audio-capture")]

    def launch(wav: Path):
        args = [*others, f"--use-file-for-fake-audio-capture={wav}"]
        launched.append(browser_type.launch(**{**browser_type_launch_args, "args": args}))
        return launched[-1]

    yield launch
    for browser in launched:
        browser.close()


PASSWORD = "browser-test-password"


@pytest.fixture
def make_user(transactional_db, django_user_model):
    """Create a user the live server can see (transactional: committed rows, not a test transaction)."""

    def make(username: str, *, staff: bool = False, perms: tuple[str, ...] = ()):
        user = django_user_model.objects.create_user(username=username, password=PASSWORD, is_staff=staff)
        user.user_permissions.add(*Permission.objects.filter(codename__in=perms))
        return user

    return make


@pytest.fixture
def screenshot_dir() -> Path | None:
    """Where tests drop screenshots for a human to look at: ``PARLEY_SCREENSHOTS=/some/dir`` (off by default)."""
    raw = os.environ.get("PARLEY_SCREENSHOTS")
    if not raw:
        return None
    path = Path(raw)
    path.mkdir(parents=True, exist_ok=True)
    return path


# The shared server runs the echo engine. Two slots make the queue reachable with three callers;
# a simulated prefill makes the progress bar observable.
LIVE_SERVER_ENV = live_server_env("echo", PARLEY_QUEUE_MAX="4", PARLEY_ECHO_PREFILL_TICKS="15")


@pytest.fixture(scope="module")
def channels_live_server(django_db_setup, django_db_blocker):
    """The browser suite's daphne live server, with the inference settings above: one per test file, so what a
    file leaves in the server (login-failure counts, a slot still held) cannot fail the next file."""
    with run_live_server(django_db_blocker, LIVE_SERVER_ENV) as server:
        yield server
