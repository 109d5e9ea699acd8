"""The audit trail of operations actions, and the console's permissions (ending a session is
``accounts.end_session``, which the security work defined first for the occupancy page)."""

from django.conf import settings
from django.db import models


class AuditEntry(models.Model):
    """One admin action from the console: who did what to which target, and when. Never edited."""

    class Action(models.TextChoices):
        END_SESSION = "end_session", "end a session"
        DRAIN_SERVICE = "drain_service", "drain a service"
        UNDRAIN_SERVICE = "undrain_service", "resume placing on a service"
        STOP_ADMISSION = "stop_admission", "stop admitting new calls"
        RESUME_ADMISSION = "resume_admission", "resume admitting new calls"
        DISABLE_VOICE = "disable_voice", "disable a voice"

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    action = models.CharField(max_length=20, choices=Action.choices)
    target = models.CharField(max_length=200, blank=True, help_text="session id, service id or voice id")
    outcome = models.CharField(max_length=200, blank=True, help_text="what happened, e.g. 'ended' or 'not found'")

    class Meta:
        ordering = ["-at"]
        default_permissions = ("view",)
        permissions = [
            ("view_console", "Can watch the operations console and its metrics"),
            ("drain_service", "Can drain an inference service"),
            ("control_admission", "Can stop and resume admitting new calls"),
            ("disable_voice", "Can disable a voice"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}: {self.outcome}"
