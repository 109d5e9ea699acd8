"""WSGI entry point (HTTP only; the realtime endpoint needs ``webapp.asgi``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings.local")

application = get_wsgi_application()
