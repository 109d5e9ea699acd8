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
