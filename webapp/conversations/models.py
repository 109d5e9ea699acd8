"""One row per inference session, written at its lifecycle edges only (never per frame)."""

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    class Status(models.TextChoices):
        OPEN = "open", "open"
        DETACHED = "detached", "detached (socket dropped; resumable during the grace period)"
        CLOSED = "closed", "closed"
        FAILED = "failed", "failed"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    session_id = models.CharField(max_length=100, unique=True)
    engine = models.CharField(max_length=50)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    close_reason = models.CharField(max_length=30, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"{self.session_id} ({self.user}, {self.status})"


class ClientSecret(models.Model):
    """An ephemeral credential for one ``/v1/realtime`` connect (``POST /v1/realtime/client_secrets``).

    Minted with an API key for a browser that must not hold that key: it expires after a short TTL, opens
    at most one session, and carries the session configuration it was minted for. Only a hash is stored.
    Revoking or deleting the key that minted it kills it, and ends the session it opened.
    """

    api_key = models.ForeignKey("accounts.ApiKey", on_delete=models.CASCADE, related_name="client_secrets")
    secret_hash = models.CharField(max_length=64, unique=True)  # sha256 hex of the whole secret
    model = models.CharField(max_length=100, blank=True)  # the engine the session must use; blank: the default
    session = models.JSONField(default=dict)  # the validated session configuration (protocol.SessionConfig)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        state = "used" if self.used_at else "unused"
        return f"client secret of {self.api_key} ({state}, expires {self.expires_at:%H:%M:%S})"
