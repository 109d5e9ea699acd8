"""Parley's Django project. Exposes ``celery_app`` so ``celery -A webapp`` finds it."""

from webapp.celery import app as celery_app

__all__ = ["celery_app"]
