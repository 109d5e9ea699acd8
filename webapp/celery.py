"""The Celery app: configured from Django settings (namespace ``CELERY_``); eager unless a broker is set."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings.local")  # the process default, as in manage.py

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
