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
    recording_retention_days: int  # 0 = keep recordings forever
    recordings_s3_bucket: str  # "" = finished recordings are local files under var/media
    recordings_s3_endpoint_url: str  # an S3-compatible server; "" = AWS
    recordings_s3_region: str
    recordings_s3_access_key: str  # "" = boto3's own credential chain
    recordings_s3_secret_key: str
    allowed_origins: list[str]  # browser origins allowed on /v1/realtime besides the site's own
    connect_rate: str  # WebSocket connects per client IP ("limits" notation, e.g. "30/minute")
    key_failure_rate: str  # wrong API keys per client IP before that IP is refused for a while
    login_failure_limit: int  # wrong passwords per client IP before django-axes locks it out
    hsts_seconds: int  # production's Strict-Transport-Security max-age


def read_env() -> WebEnv:
    var_dir = Path(_text("PARLEY_VAR_DIR") or BASE_DIR / "var")
    return WebEnv(
        # Unset: local.py keeps a generated key under var/, production.py refuses to start.
        secret_key=_text("DJANGO_SECRET_KEY"),
        debug=_flag("DJANGO_DEBUG", False),
        allowed_hosts=_csv("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost"),
        csrf_trusted_origins=_csv("DJANGO_CSRF_TRUSTED_ORIGINS", ""),
        database_url=_text("DATABASE_URL"),
        redis_url=_text("REDIS_URL"),
        celery_broker_url=_text("CELERY_BROKER_URL"),
        var_dir=var_dir,
        max_event_bytes=_int("PARLEY_MAX_EVENT_BYTES", 1024 * 1024),
        default_model=_text("PARLEY_ENGINE"),
        recording_retention_days=_int("PARLEY_RECORDING_RETENTION_DAYS", 90),
        recordings_s3_bucket=_text("PARLEY_RECORDINGS_S3_BUCKET"),
        recordings_s3_endpoint_url=_text("PARLEY_RECORDINGS_S3_ENDPOINT_URL"),
        recordings_s3_region=_text("PARLEY_RECORDINGS_S3_REGION"),
        recordings_s3_access_key=_text("PARLEY_RECORDINGS_S3_ACCESS_KEY"),
        recordings_s3_secret_key=_text("PARLEY_RECORDINGS_S3_SECRET_KEY"),
        allowed_origins=_csv("PARLEY_ALLOWED_ORIGINS", ""),
        connect_rate=_text("PARLEY_CONNECT_RATE", "30/minute"),
        key_failure_rate=_text("PARLEY_KEY_FAILURE_RATE", "10/minute"),
        login_failure_limit=_int("PARLEY_LOGIN_FAILURE_LIMIT", 5),
        hsts_seconds=_int("DJANGO_HSTS_SECONDS", 365 * 24 * 3600),
    )


ENV = read_env()
