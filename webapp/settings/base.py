"""Settings shared by every environment. Values come from ``webapp.env`` only."""

from __future__ import annotations

from datetime import timedelta

import dj_database_url
from csp.constants import NONCE, NONE, SELF

from webapp.common.logs import logging_config
from webapp.env import BASE_DIR, ENV

SECRET_KEY = ENV.secret_key
DEBUG = ENV.debug
ALLOWED_HOSTS = ENV.allowed_hosts
CSRF_TRUSTED_ORIGINS = ENV.csrf_trusted_origins
VAR_DIR = ENV.var_dir

INSTALLED_APPS = [
    "daphne",  # first: makes runserver serve ASGI (WebSockets)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "axes",  # login throttling (AccessAttempt rows)
    "csp",
    "webapp.accounts",
    "webapp.personas",
    "webapp.conversations",
    "webapp.calls",
    "webapp.operations",
    "webapp.recordings",
]

MIDDLEWARE = [
    "webapp.common.hosts.KnownHostMiddleware",  # first: no page, not even a debug page, for foreign hosts
    "django.middleware.security.SecurityMiddleware",
    "webapp.common.cors.realtime_cors",  # before CSRF: a preflight is answered here (see the module)
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out login into the lockout page
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"
ASGI_APPLICATION = "webapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

if ENV.database_url:
    DATABASES = {"default": dj_database_url.parse(ENV.database_url, conn_max_age=60)}
else:
    # The embedded default is written by several threads at once (consumers, the recording and voice tasks):
    # IMMEDIATE transactions take the write lock up front (a deferred one that upgrades later fails at once
    # with "database is locked"), and a writer waits up to 20 s. (WAL was tried: a live server's reader then
    # missed a key the test had just created.)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "db.sqlite3",
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# ---- security (docs/security.md) ------------------------------------------------------------------
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out client before any password hash
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = ENV.login_failure_limit
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = ["ip_address"]  # per client: many usernames from one address are one attacker
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# Browser origins allowed to open /v1/realtime with the session cookie, besides the site's own origin
# (scheme, host and port compared whole).
PARLEY_ALLOWED_ORIGINS = ENV.allowed_origins
# STUN/TURN servers handed to the call page for WebRTC calls (webapp/webrtc/ice.py; docs/deploy.md).
PARLEY_ICE_SERVERS = [server.model_dump(exclude_none=True) for server in ENV.ice_servers]
# WebSocket connects per user and per API key (a moving minute); failed authentications per client IP
# ("limits" notation) before that IP is refused: see webapp/common/throttling.py.
PARLEY_CONNECTS_PER_USER_PER_MINUTE = ENV.connects_per_user_per_minute
PARLEY_CONNECTS_PER_KEY_PER_MINUTE = ENV.connects_per_key_per_minute
PARLEY_WEB_LOOP_LAG_MS = ENV.web_loop_lag_ms  # common.loop_load
PARLEY_KEY_FAILURE_RATE = ENV.key_failure_rate
# A live call re-reads its user this often (s): one deactivated without a save signal loses the call.
PARLEY_ACCOUNT_CHECK_S = ENV.account_check_s
# Ephemeral client secrets: default lifetime and the longest one a request may ask for (s).
PARLEY_CLIENT_SECRET_TTL_S = min(ENV.client_secret_ttl_s, ENV.client_secret_max_ttl_s)
PARLEY_CLIENT_SECRET_MAX_TTL_S = ENV.client_secret_max_ttl_s
# The failed-authentication limit and login lockouts key on the client's address: X-Forwarded-For counts only
# from these (webapp.common.forwarded).
PARLEY_TRUSTED_PROXIES = tuple(ENV.trusted_proxies)
# The pages load scripts and styles from static/ only; the one inline <style> (base.html) carries the nonce.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, NONCE],
        "img-src": [SELF, "data:", "blob:"],
        "media-src": [SELF, "blob:"],
        "connect-src": [SELF],  # CSP3: 'self' also covers ws(s):// to this host (/v1/realtime)
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = ENV.static_root or VAR_DIR / "staticfiles"  # production: outside the private var/ (nginx reads it)
MEDIA_ROOT = VAR_DIR / "media"
# Voices and recordings are people's voices: readable by this service's user only, whatever the umask
# (Django's defaults leave both to the umask: 0644 files under a 022 one).
FILE_UPLOAD_PERMISSIONS = 0o600
FILE_UPLOAD_DIRECTORY_PERMISSIONS = 0o700

# Finished recordings (webapp/recordings/storage.py): local files by default, an S3 bucket when configured.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "recordings": (
        {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": ENV.recordings_s3_bucket,
                "endpoint_url": ENV.recordings_s3_endpoint_url or None,
                "region_name": ENV.recordings_s3_region or None,
                "access_key": ENV.recordings_s3_access_key or None,
                "secret_key": ENV.recordings_s3_secret_key or None,
                "default_acl": None,
                "querystring_auth": True,
            },
        }
        if ENV.recordings_s3_bucket
        else {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": MEDIA_ROOT}}
    ),
}

# ---- channels ------------------------------------------------------------------------------
if ENV.redis_url:
    # redis-py 8 reads with a 5 s socket timeout by default, exactly channels-redis's 5 s BZPOPMIN wait:
    # an idle consumer's receive then times out and daphne closes its socket (1011). Read longer than that.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": ENV.redis_url, "socket_timeout": 30}]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# Connect and API-key throttles count in Redis when there is one, so every web process shares them.
PARLEY_RATE_LIMIT_STORAGE = f"async+{ENV.redis_url}" if ENV.redis_url else "async+memory://"

# ---- celery (namespace CELERY_, read by webapp/celery.py) ---------------------------------------
if ENV.celery_broker_url:
    CELERY_BROKER_URL = ENV.celery_broker_url
    CELERY_TASK_ALWAYS_EAGER = False
else:
    CELERY_BROKER_URL = "memory://"
    CELERY_TASK_ALWAYS_EAGER = True  # no broker running: tasks run inline
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    # Recordings whose session ended with nobody to ask for processing (a killed service, a lost task).
    "recordings-sweep": {"task": "webapp.recordings.tasks.sweep_recordings", "schedule": 60.0},
    "recordings-purge": {"task": "webapp.recordings.tasks.purge_recordings", "schedule": 3600.0},
}

# ---- parley ------------------------------------------------------------------------------------
PARLEY_MAX_EVENT_BYTES = ENV.max_event_bytes  # larger client events get event_too_large
PARLEY_DEFAULT_MODEL = ENV.default_model or None
PARLEY_RECORDING_RETENTION_DAYS = ENV.recording_retention_days  # 0 keeps recordings forever
PARLEY_VERIFY_CONSENT_PHRASE = ENV.verify_consent_phrase  # the consent clip must say the random phrase
PARLEY_TRANSCRIBER = ENV.transcriber  # the caller's side of each recording, in post-processing
PARLEY_WHISPER_WEIGHTS = ENV.whisper_weights
# Input sample rates the endpoint accepts; the facade resamples any of them to the engine rate.
PARLEY_INPUT_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
PARLEY_ADMIN_PASSWORD_FILE = VAR_DIR / "admin-password.txt"
PARLEY_WARM_START = ENV.warm_start  # webapp/calls/warm_start.py

# The console format for `make run`; production.py switches to JSON lines. Both print extra={...} fields.
LOGGING = logging_config(json_lines=False)
