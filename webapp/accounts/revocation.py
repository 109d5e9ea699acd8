"""Ending live calls when their credentials go: a revoked API key, a deactivated or deleted user.

Each realtime socket joins the channel-layer groups of its user and (when it came with one) of its
API key. Saving a revoked key or an inactive user announces ``credentials.revoked`` to those groups
once the transaction commits; the consumer then closes its session with reason
``credentials_revoked``. Reconnects are refused by authentication itself (a revoked key or an inactive
user never authenticates). Signals rather than the services alone, so that the admin's edits count too.

With the in-memory channel layer (``make run``) only the web process that made the change hears it;
a deployment with several web processes uses the Redis channel layer (REDIS_URL).
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from webapp.accounts.models import ApiKey

logger = logging.getLogger(__name__)

MESSAGE_TYPE = "credentials.revoked"  # handled by RealtimeConsumer.credentials_revoked


def user_group(user_id: object) -> str:
    return f"parley.user.{user_id}"


def api_key_group(api_key_id: object) -> str:
    return f"parley.apikey.{api_key_id}"


def announce_revoked(group: str, *, why: str) -> None:
    """Tell every socket in ``group`` to end its session, after the current transaction commits."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        logger.info("credentials.revoked", extra={"group": group, "why": why})
        async_to_sync(layer.group_send)(group, {"type": MESSAGE_TYPE, "why": why})

    transaction.on_commit(send)


def _api_key_saved(sender, instance: ApiKey, **kwargs) -> None:
    if instance.revoked_at is not None:
        announce_revoked(api_key_group(instance.pk), why="api_key_revoked")


def _api_key_deleted(sender, instance: ApiKey, **kwargs) -> None:
    announce_revoked(api_key_group(instance.pk), why="api_key_deleted")


def _user_saved(sender, instance, **kwargs) -> None:
    if not instance.is_active:
        announce_revoked(user_group(instance.pk), why="user_deactivated")


def _user_deleted(sender, instance, **kwargs) -> None:
    announce_revoked(user_group(instance.pk), why="user_deleted")


def connect_signals() -> None:
    post_save.connect(_api_key_saved, sender=ApiKey, dispatch_uid="parley.apikey_saved")
    post_delete.connect(_api_key_deleted, sender=ApiKey, dispatch_uid="parley.apikey_deleted")
    post_save.connect(_user_saved, sender=settings.AUTH_USER_MODEL, dispatch_uid="parley.user_saved")
    post_delete.connect(_user_deleted, sender=settings.AUTH_USER_MODEL, dispatch_uid="parley.user_deleted")
