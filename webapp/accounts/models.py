"""API keys and sign-up invites."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiKey(models.Model):
    """A per-user key for ``Authorization: Bearer``. Only a hash is stored; the key is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, help_text="The first characters of the key, to tell keys apart.")
    key_hash = models.CharField(max_length=64, unique=True)  # sha256 hex of the whole key
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Invite(models.Model):
    """A one-time sign-up code created by staff."""

    code = models.CharField(max_length=40, unique=True)
    note = models.CharField(max_length=200, blank=True, help_text="Who the invite is for.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    used_by = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="invite"
    )
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.code

    @property
    def is_used(self) -> bool:
        return self.used_at is not None


class ConsolePermissions(models.Model):
    """No table: the holder of the staff console's action permissions (``auth.Permission`` rows).

    Being staff lets a user see the operations pages; acting on other users' sessions takes an
    explicit grant (``accounts.end_session``), as minting invites takes ``accounts.add_invite``.
    """

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("end_session", "Can end any user's live session from the operations console")]
