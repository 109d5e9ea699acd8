"""Settings come from the environment in one place: embedded defaults, or the production path."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, django
from django.conf import settings
django.setup()
print(json.dumps({
    "db": settings.DATABASES["default"]["ENGINE"],
    "db_name": str(settings.DATABASES["default"]["NAME"]),
    "layer": settings.CHANNEL_LAYERS["default"]["BACKEND"],
    "eager": settings.CELERY_TASK_ALWAYS_EAGER,
    "broker": settings.CELERY_BROKER_URL,
    "hosts": settings.ALLOWED_HOSTS,
    "first_app": settings.INSTALLED_APPS[0],
    "apps": settings.INSTALLED_APPS,
    "celery_app": __import__("webapp").celery_app.main,
}))
"""
PRODUCTION_VARS = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "PARLEY_INFERENCE_URL", "DJANGO_ALLOWED_HOSTS")


def settings_with(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARS}
    clean["DJANGO_SETTINGS_MODULE"] = "webapp.settings.local"
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_embedded_defaults_need_nothing_running():
    s = settings_with()
    assert s["db"] == "django.db.backends.sqlite3" and s["db_name"].endswith("var/db.sqlite3")
    assert s["layer"] == "channels.layers.InMemoryChannelLayer"
    assert s["eager"] is True
    assert s["hosts"] == ["127.0.0.1", "localhost"]
    assert s["first_app"] == "daphne"
    assert {"webapp.calls", "webapp.operations", "webapp.accounts", "webapp.conversations"} <= set(s["apps"])
    assert s["celery_app"] == "webapp"


def test_production_path_is_selected_by_env_vars():
    s = settings_with(
        DATABASE_URL="postgres://parley@db.internal:5432/parley",
        REDIS_URL="redis://cache.internal:6379/0",
        CELERY_BROKER_URL="redis://cache.internal:6379/1",
        DJANGO_ALLOWED_HOSTS="parley.example.com, .example.org",
    )
    assert s["db"] == "django.db.backends.postgresql" and s["db_name"] == "parley"
    assert s["layer"] == "channels_redis.core.RedisChannelLayer"
    assert s["eager"] is False and s["broker"] == "redis://cache.internal:6379/1"
    assert s["hosts"] == ["parley.example.com", ".example.org"]


@pytest.mark.parametrize(
    ("var", "value"),
    [("DJANGO_DEBUG", "ture"), ("PARLEY_RECORDING_RETENTION_DAYS", "-1"), ("PARLEY_KEY_FAILURE_RATE", "fast")],
)
def test_a_bad_value_stops_start_up_naming_the_variable_and_value(var, value):
    clean = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARS}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "webapp.settings.local", var: value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert f"{var}={value!r}" in result.stderr, result.stderr[-2000:]
