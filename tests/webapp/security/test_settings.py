"""Finding 4 (settings) and the var/ part of finding 6, through real processes: settings imports,
``manage.py check --deploy`` and ``scripts/run.sh`` itself."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
STRONG_SECRET = secrets.token_urlsafe(50)
PROBE = "import django; from django.conf import settings; django.setup(); print(settings.SECRET_KEY)"
# Variables of the developer's or CI's shell that would change what these processes see.
SCRUBBED = (
    "DJANGO_SECRET_KEY",
    "DJANGO_ALLOW_ASYNC_UNSAFE",  # set by tests that drive the ORM beside a running event loop
    "DJANGO_DEBUG",
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "PARLEY_INFERENCE_URL",
)


def run(args: list[str], *, settings: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    full_env = {**clean, "DJANGO_SETTINGS_MODULE": settings, **env}
    return subprocess.run(args, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---- production -----------------------------------------------------------------------------


@pytest.mark.parametrize("weak", ["", "changeme", "parley-insecure-development-key-change-me", "x" * 60])
def test_production_refuses_a_weak_or_missing_secret(weak, tmp_path):
    result = run([sys.executable, "-c", PROBE], settings="webapp.settings.production", DJANGO_SECRET_KEY=weak)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "DJANGO_SECRET_KEY" in result.stderr


def test_production_refuses_debug():
    result = run(
        [sys.executable, "-c", PROBE],
        settings="webapp.settings.production",
        DJANGO_SECRET_KEY=STRONG_SECRET,
        DJANGO_DEBUG="1",
    )
    assert result.returncode != 0 and "DEBUG must be off" in result.stderr


def test_check_deploy_is_clean_under_production_settings(tmp_path):
    result = run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        settings="webapp.settings.production",
        DJANGO_SECRET_KEY=STRONG_SECRET,
        DJANGO_ALLOWED_HOSTS="parley.example.com",
        PARLEY_VAR_DIR=str(tmp_path / "var"),
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no issues" in result.stdout


WRITE_MEDIA = """
import django; django.setup()
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from webapp.recordings import storage
print(default_storage.save("voices/7/clip.wav", ContentFile(b"RIFF")))
print(storage.save(storage.file_name(user_id=4, session_id="sess_x", filename="call.ogg"), b"OggS"))
"""


def test_files_written_under_production_settings_are_private_whatever_the_umask(tmp_path):
    """Voices and recordings saved through Django's storage: 0600 files in 0700 folders, var/ itself 0700,
    with the usual umask 022 (which alone gives 0644 and 0755)."""
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    clean = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env = {**clean, "DJANGO_SETTINGS_MODULE": "webapp.settings.production", "DJANGO_SECRET_KEY": STRONG_SECRET,
           "PARLEY_VAR_DIR": str(var), "DJANGO_STATIC_ROOT": str(tmp_path / "static")}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", WRITE_MEDIA], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: os.umask(0o022),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    media = var / "media"
    assert mode(var) == 0o700
    for name in result.stdout.split():
        path = media / name
        assert mode(path) == 0o600, name
        while path.parent != media:
            path = path.parent
            assert mode(path) == 0o700, path


def test_production_refuses_static_files_inside_the_private_var(tmp_path):
    result = run([sys.executable, "-c", PROBE], settings="webapp.settings.production",
                 DJANGO_SECRET_KEY=STRONG_SECRET, PARLEY_VAR_DIR=str(tmp_path / "var"))  # fmt: skip
    assert result.returncode != 0 and "DJANGO_STATIC_ROOT must be outside" in result.stderr


def test_every_unit_runs_with_a_private_umask():
    for unit in sorted((ROOT / "deploy" / "systemd").glob("*.service")):
        assert "\nUMask=0077\n" in unit.read_text(), unit.name


# ---- make run (local settings) ---------------------------------------------------------------


def test_local_settings_generate_a_private_secret_once_and_keep_it(tmp_path):
    var = tmp_path / "var"
    first = run([sys.executable, "-c", PROBE], settings="webapp.settings.local", PARLEY_VAR_DIR=str(var))
    assert first.returncode == 0, first.stderr[-2000:]
    key = first.stdout.strip().splitlines()[-1]
    assert len(key) >= 50 and not key.startswith("parley-insecure")
    assert mode(var) == 0o700 and mode(var / "secret-key") == 0o600
    again = run([sys.executable, "-c", PROBE], settings="webapp.settings.local", PARLEY_VAR_DIR=str(var))
    assert again.stdout.strip().splitlines()[-1] == key  # kept: sessions survive a restart
    other = run([sys.executable, "-c", PROBE], settings="webapp.settings.local", PARLEY_VAR_DIR=str(tmp_path / "v2"))
    assert other.stdout.strip().splitlines()[-1] != key  # and never one shared by every checkout


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "parley.example.com"])
def test_make_run_refuses_a_non_loopback_host_while_debugging(host, tmp_path):
    result = run(["bash", "scripts/run.sh", host, "8765"], settings="webapp.settings.local", timeout=60)
    assert result.returncode == 2
    assert f"refusing to serve with DEBUG on at {host}" in result.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, host: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_make_run_keeps_var_private_and_shows_no_debug_page_to_a_foreign_host(tmp_path):
    var, port = tmp_path / "var", free_port()
    clean = {k: v for k, v in os.environ.items() if k not in SCRUBBED and k != "PARLEY_INFERENCE_TOKEN"}
    env = {
        **clean,
        "PARLEY_VAR_DIR": str(var),
        "PARLEY_ENGINE": "echo",
        "DJANGO_SETTINGS_MODULE": "webapp.settings.local",
    }
    server = subprocess.Popen(
        ["bash", "scripts/run.sh", "127.0.0.1", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                status, _ = get(f"http://127.0.0.1:{port}/accounts/login/", f"127.0.0.1:{port}")
                break
            except OSError:
                assert server.poll() is None, server.stdout.read().decode()[-3000:]
                assert time.monotonic() < deadline, "make run did not start serving"
                time.sleep(0.5)
        assert status == 200
        assert mode(var) == 0o700
        for name in ("db.sqlite3", "secret-key", "inference-token", "admin-password.txt"):
            assert mode(var / name) == 0o600, name
        # DNS rebinding / a foreign Host: a short plain refusal, not Django's technical page.
        status, body = get(f"http://127.0.0.1:{port}/", "evil.example")
        assert status == 400 and body == b"Unknown host."
        status, body = get(f"http://127.0.0.1:{port}/does-not-exist", "evil.example:80")
        assert status == 400 and len(body) < 100
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
