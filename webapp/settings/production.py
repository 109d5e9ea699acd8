"""Production: secrets and services must come from the environment."""

from django.core.exceptions import ImproperlyConfigured

from webapp.settings.base import *  # noqa: F403

# DEBUG comes from DJANGO_DEBUG through base (off by default); local.py is the only one that forces it on.
if SECRET_KEY.startswith("parley-insecure"):  # noqa: F405
    raise ImproperlyConfigured("Set DJANGO_SECRET_KEY for production.")
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
