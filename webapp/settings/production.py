"""Production: secrets and services must come from the environment; HTTPS only.

Refuses to start with a weak or missing ``DJANGO_SECRET_KEY`` or with ``DJANGO_DEBUG`` on;
``manage.py check --deploy`` is clean under these settings (tests/webapp/security/test_settings.py).
"""

from django.core.exceptions import ImproperlyConfigured

from webapp.common.logs import logging_config
from webapp.env import ENV
from webapp.settings.base import *  # noqa: F403
from webapp.settings.secret_files import private_dir, weak_secret_reason

if reason := weak_secret_reason(SECRET_KEY):  # noqa: F405
    raise ImproperlyConfigured(f"{reason}.")
if DEBUG:  # noqa: F405
    raise ImproperlyConfigured("DEBUG must be off in production: unset DJANGO_DEBUG.")

# The database, media (voices, recordings) and keys live under var/: this user's only, whatever the umask
# (files stored through Django are 0600 in 0700 folders: FILE_UPLOAD_* in base.py; units set UMask=0077).
private_dir(VAR_DIR)  # noqa: F405
if STATIC_ROOT.resolve().is_relative_to(VAR_DIR.resolve()):  # noqa: F405
    raise ImproperlyConfigured(
        "DJANGO_STATIC_ROOT must be outside PARLEY_VAR_DIR (private): the front proxy serves it."
    )

# TLS ends at the front proxy, which must set X-Forwarded-Proto (docs/security.md).
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = True
SECURE_HSTS_SECONDS = ENV.hsts_seconds
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True

# One JSON object per line for the log collector, with the extra={...} fields (session_id, reason, ...) as keys.
LOGGING = logging_config(json_lines=True)
