"""The only place that reads ``os.environ`` for Django (settings import from here).

Every value has an embedded default that needs nothing running: SQLite, the in-memory channel
layer and eager Celery. Setting the production variables switches each part over independently.
The inference service's variables (``PARLEY_INFERENCE_URL``, ``PARLEY_SLOTS``, ...) are read by
``inference/config.py``, not here.

pydantic-settings parses and bounds every value: a bad one (``DJANGO_DEBUG=ture``, a negative
retention) stops start-up with an ``EnvError`` naming the variable and the value, instead of
silently becoming a default. An empty variable counts as unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

BASE_DIR = Path(__file__).resolve().parent.parent
_SECRETS = {
    "DJANGO_SECRET_KEY",
    "PARLEY_RECORDINGS_S3_SECRET_KEY",
    "PARLEY_ICE_SERVERS",
}  # TURN credentials  # never echoed in an error

Csv = Annotated[list[str], NoDecode]  # "a, b" -> ["a", "b"] (not JSON)


class IceServer(BaseModel):
    """One entry of ``PARLEY_ICE_SERVERS``, in the browser's RTCIceServer shape."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    urls: str | list[str]
    username: str | None = None
    credential: str | None = None

    @field_validator("urls")
    @classmethod
    def _ice_urls(cls, urls: str | list[str]) -> str | list[str]:
        for url in [urls] if isinstance(urls, str) else urls:
            if not url.startswith(("stun:", "stuns:", "turn:", "turns:")):
                raise ValueError(f"an ICE server URL starts with stun:, stuns:, turn: or turns: (got {url!r})")
        return urls


class EnvError(ValueError):
    """An environment variable has a value Django cannot start with; the message names it and its value."""


class WebEnv(BaseSettings):
    """Everything the Django settings take from the environment (frozen once read)."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", env_ignore_empty=True, str_strip_whitespace=True)

    # Unset: local.py keeps a generated key under var/, production.py refuses to start.
    secret_key: str = Field("", validation_alias="DJANGO_SECRET_KEY")
    debug: bool = Field(False, validation_alias="DJANGO_DEBUG")
    allowed_hosts: Csv = Field(["127.0.0.1", "localhost"], validation_alias="DJANGO_ALLOWED_HOSTS")
    csrf_trusted_origins: Csv = Field([], validation_alias="DJANGO_CSRF_TRUSTED_ORIGINS")
    database_url: str = Field("", validation_alias="DATABASE_URL")  # "" = SQLite in var/
    redis_url: str = Field("", validation_alias="REDIS_URL")  # "" = in-memory channel layer
    celery_broker_url: str = Field("", validation_alias="CELERY_BROKER_URL")  # "" = eager Celery
    var_dir: Path = Field(BASE_DIR / "var", validation_alias="PARLEY_VAR_DIR")
    # collectstatic's target; unset = var/staticfiles (production: a folder the front proxy may read)
    static_root: Path | None = Field(None, validation_alias="DJANGO_STATIC_ROOT")
    max_event_bytes: int = Field(1024 * 1024, ge=1024, validation_alias="PARLEY_MAX_EVENT_BYTES")
    default_model: str = Field("", validation_alias="PARLEY_ENGINE")
    # 0 = keep recordings forever
    recording_retention_days: int = Field(90, ge=0, validation_alias="PARLEY_RECORDING_RETENTION_DAYS")
    # "" = finished recordings are local files under var/media
    recordings_s3_bucket: str = Field("", validation_alias="PARLEY_RECORDINGS_S3_BUCKET")
    # an S3-compatible server; "" = AWS
    recordings_s3_endpoint_url: str = Field("", validation_alias="PARLEY_RECORDINGS_S3_ENDPOINT_URL")
    recordings_s3_region: str = Field("", validation_alias="PARLEY_RECORDINGS_S3_REGION")
    # "" = boto3's own credential chain
    recordings_s3_access_key: str = Field("", validation_alias="PARLEY_RECORDINGS_S3_ACCESS_KEY")
    recordings_s3_secret_key: str = Field("", validation_alias="PARLEY_RECORDINGS_S3_SECRET_KEY")
    # browser origins allowed on /v1/realtime besides the site's own
    allowed_origins: Csv = Field([], validation_alias="PARLEY_ALLOWED_ORIGINS")
    # WebRTC calls: STUN/TURN servers for the call page (JSON list of RTCIceServer; docs/deploy.md)
    ice_servers: list[IceServer] = Field([], validation_alias="PARLEY_ICE_SERVERS")
    # WebSocket connects per signed-in user (session cookie) and per API key, in a moving minute: generous,
    # a guard against a runaway client, not a quota (an office behind one address is many users)
    connects_per_user_per_minute: int = Field(120, ge=1, validation_alias="PARLEY_CONNECTS_PER_USER_PER_MINUTE")
    connects_per_key_per_minute: int = Field(600, ge=1, validation_alias="PARLEY_CONNECTS_PER_KEY_PER_MINUTE")
    # new calls are refused while this web process's event loop runs later than this (90th percentile over 5 s, ms):
    # past it every call of the process is served late together (common.loop_load); 0 = no such limit
    web_loop_lag_ms: float = Field(40.0, ge=0, validation_alias="PARLEY_WEB_LOOP_LAG_MS")
    # failed authentications (wrong API keys, connects without credentials) per client IP before that IP
    # is refused for a while: the only per-address limit
    key_failure_rate: str = Field("10/minute", validation_alias="PARLEY_KEY_FAILURE_RATE")
    # wrong passwords per client IP before django-axes locks it out
    login_failure_limit: int = Field(5, ge=1, validation_alias="PARLEY_LOGIN_FAILURE_LIMIT")
    # proxies whose X-Forwarded-For is believed (addresses or networks); the client is the rightmost other hop
    trusted_proxies: Csv = Field(["127.0.0.1", "::1"], validation_alias="PARLEY_TRUSTED_PROXIES")
    # a cloned voice's consent recording must say the form's random phrase (PocketSphinx keyword spotting)
    verify_consent_phrase: bool = Field(True, validation_alias="PARLEY_VERIFY_CONSENT_PHRASE")
    # recordings' caller track: auto (Whisper when its weights are set, else PocketSphinx), pocketsphinx, whisper, off
    transcriber: Literal["auto", "pocketsphinx", "whisper", "off"] = Field(
        "auto", validation_alias="PARLEY_TRANSCRIBER"
    )
    # a faster-whisper (CTranslate2) model folder; "" = the embedded PocketSphinx transcribes
    whisper_weights: str = Field("", validation_alias="PARLEY_WHISPER_WEIGHTS")
    # how often a live call re-reads its user: deactivated without a save signal (a queryset update) ends it
    account_check_s: float = Field(15.0, gt=0, le=3600, validation_alias="PARLEY_ACCOUNT_CHECK_S")
    # ephemeral client secrets (POST /v1/realtime/client_secrets): the lifetime of one minted without
    # expires_after, and the longest a request may ask for (OpenAI's bounds: 10 s to 2 h, 10 min by default)
    client_secret_ttl_s: int = Field(600, ge=10, le=7200, validation_alias="PARLEY_CLIENT_SECRET_TTL_S")
    client_secret_max_ttl_s: int = Field(7200, ge=10, le=7200, validation_alias="PARLEY_CLIENT_SECRET_MAX_TTL_S")
    # auto: a server with in-process inference loads the engine and prepares the call page's default persona
    # and voice in the background as it starts; off: the first call does it (the test settings say off)
    warm_start: Literal["auto", "off"] = Field("auto", validation_alias="PARLEY_WARM_START")
    # production's Strict-Transport-Security max-age
    hsts_seconds: int = Field(365 * 24 * 3600, ge=0, validation_alias="DJANGO_HSTS_SECONDS")

    @field_validator("allowed_hosts", "csrf_trusted_origins", "allowed_origins", "trusted_proxies", mode="before")
    @classmethod
    def _split_csv(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        import ipaddress

        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError as exc:
                raise ValueError(f"{entry!r} is not an IP address or network") from exc
        return value

    @field_validator("key_failure_rate")
    @classmethod
    def _rate(cls, value: str) -> str:
        from limits import parse

        try:
            parse(value)
        except ValueError as exc:
            raise ValueError('expected a rate such as "30/minute"') from exc
        return value


def describe(exc: ValidationError) -> str:
    """One line per bad variable: ``NAME='value': what is wrong`` (secrets' values are not shown)."""
    lines = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "?"
        shown = "<hidden>" if name in _SECRETS else repr(error.get("input"))
        lines.append(f"{name}={shown}: {error['msg']}")
    return "; ".join(lines)


def read_env() -> WebEnv:
    """The environment as typed settings; raises ``EnvError`` naming every bad variable and its value."""
    try:
        return WebEnv()
    except ValidationError as exc:
        raise EnvError(f"bad environment: {describe(exc)}") from None


ENV = read_env()
