"""Production: secrets and services must come from the environment; HTTPS only.

Refuses to start with a weak or missing ``DJANGO_SECRET_KEY`` or with ``DJANGO_DEBUG`` on;
``manage.py check --deploy`` is clean under these settings (tests/webapp/security/test_settings.py).
"""

from django.core.exceptions import ImproperlyConfigured

from webapp.common.logs import logging_config
from webapp.env import ENV
from webapp.settings.base import *  # noqa: F403
from webapp.settings.secret_files import weak_secret_reason

if reason := weak_secret_reason(SECRET_KEY):  # noqa: F405
    raise ImproperlyConfigured(f"{reason}.")
if DEBUG:  # noqa: F405
    raise ImproperlyConfigured("DEBUG must be off in production: unset DJANGO_DEBUG.")

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
