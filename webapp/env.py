"""The only place that reads ``os.environ`` for Django (settings import from here).

Every value has an embedded default that needs nothing running: SQLite, the in-memory channel
layer and eager Celery. Setting the production variables switches each part over independently.
The inference service's variables (``PARLEY_INFERENCE_URL``, ``PARLEY_SLOTS``, ...) are read by
``inference/config.py``, not here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def _text(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def _flag(name: str, default: bool) -> bool:
    raw = _text(name)
    if not raw:
        return default
    return raw.lower() in {"1", "true", "yes", "on"}


def _int(name: str, default: int) -> int:
    raw = _text(name)
    return int(raw) if raw else default


def _csv(name: str, default: str) -> list[str]:
    return [part.strip() for part in _text(name, default).split(",") if part.strip()]


@dataclass(frozen=True)
class WebEnv:
    """Everything the Django settings take from the environment."""

    secret_key: str
    debug: bool
    allowed_hosts: list[str]
    csrf_trusted_origins: list[str]
    database_url: str  # "" = SQLite in var/
    redis_url: str  # "" = in-memory channel layer
    celery_broker_url: str  # "" = eager Celery
    var_dir: Path
    max_event_bytes: int
    default_model: str


def read_env() -> WebEnv:
    var_dir = Path(_text("PARLEY_VAR_DIR") or BASE_DIR / "var")
    return WebEnv(
        # The fallback key is only good for the embedded default; production.py refuses it.
        secret_key=_text("DJANGO_SECRET_KEY", "parley-insecure-development-key-change-me"),
        debug=_flag("DJANGO_DEBUG", False),
        allowed_hosts=_csv("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost"),
        csrf_trusted_origins=_csv("DJANGO_CSRF_TRUSTED_ORIGINS", ""),
        database_url=_text("DATABASE_URL"),
        redis_url=_text("REDIS_URL"),
        celery_broker_url=_text("CELERY_BROKER_URL"),
        var_dir=var_dir,
        max_event_bytes=_int("PARLEY_MAX_EVENT_BYTES", 1024 * 1024),
        default_model=_text("PARLEY_ENGINE"),
    )


ENV = read_env()
