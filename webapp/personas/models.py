"""Personas (versioned system-prompt text) and voices (reference audio + processed prompts).

``owner`` null means shared with every user; a private row is visible only to its owner and staff
(``selectors``). Files live in Django's default storage (outside static files) and are served only
through permission-checked views.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q


class Persona(models.Model):
    """The current state of a persona; every change of a versioned field adds a ``PersonaVersion``.

    The versioning lives in ``save()`` so that every path (views, admin, shell) gets it.
    """

    VERSIONED_FIELDS = ("name", "instructions", "default_voice_id")

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="personas"
    )
    name = models.CharField(max_length=100)
    instructions = models.TextField(help_text="The persona text given to the model (system prompt).")
    default_voice = models.ForeignKey(
        "Voice", on_delete=models.SET_NULL, null=True, blank=True, related_name="default_for"
    )
    version = models.PositiveIntegerField(default=0, editable=False)
    archived = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def from_db(cls, db, field_names, values):
        instance = super().from_db(db, field_names, values)
        instance._saved_values = instance._versioned_values()
        return instance

    def _versioned_values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.VERSIONED_FIELDS)

    def save(self, *args, edited_by=None, **kwargs) -> None:
        with transaction.atomic():
            changed = getattr(self, "_saved_values", None) != self._versioned_values()
            if changed:
                self.version += 1
            super().save(*args, **kwargs)
            if changed:
                PersonaVersion.objects.create(
                    persona=self,
                    number=self.version,
                    name=self.name,
                    instructions=self.instructions,
                    default_voice_id=self.default_voice_id,
                    created_by=edited_by,
                )
                self._saved_values = self._versioned_values()


class PersonaVersion(models.Model):
    """An immutable snapshot of a persona; sessions and recordings name the version they used."""

    persona = models.ForeignKey(Persona, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    name = models.CharField(max_length=100)
    instructions = models.TextField()
    default_voice = models.ForeignKey("Voice", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["persona", "-number"]
        constraints = [models.UniqueConstraint(fields=["persona", "number"], name="persona_version_unique")]

    def __str__(self) -> str:
        return f"{self.name} v{self.number}"


def _voice_upload_path(voice: Voice, filename: str) -> str:
    # A random folder per voice: names never collide and are not guessable from the id.
    return f"voices/{voice.storage_key}/{filename}"


class Voice(models.Model):
    """A built-in (imported) or cloned voice: its audio, its processing state and its consent record."""

    class Kind(models.TextChoices):
        BUILTIN = "builtin", "built-in"
        CLONED = "cloned", "cloned"

    class Status(models.TextChoices):
        PENDING = "pending"
        PROCESSING = "processing"
        READY = "ready"
        FAILED = "failed"
        DISABLED = "disabled"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="voices"
    )
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.CLONED)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    failure_reason = models.TextField(blank=True)
    progress_stage = models.CharField(max_length=60, blank=True)
    progress_percent = models.PositiveSmallIntegerField(default=0)
    storage_key = models.CharField(max_length=32, default="", editable=False)
    reference_audio = models.FileField(upload_to=_voice_upload_path, blank=True, max_length=300)
    processed_audio = models.FileField(
        upload_to=_voice_upload_path, blank=True, max_length=300, help_text="24 kHz mono, trimmed, loudness-normalised"
    )
    duration_s = models.FloatField(null=True, blank=True, help_text="speech length after trimming")
    # consent: who read which sentence, when, from which account (cloned voices only)
    consent_audio = models.FileField(upload_to=_voice_upload_path, blank=True, max_length=300)
    consent_text = models.TextField(blank=True)
    consent_phrase = models.CharField(max_length=100, blank=True)
    consented_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    consented_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    disabled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    disabled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="voice_name_unique_per_owner"),
            models.UniqueConstraint(fields=["name"], condition=Q(owner__isnull=True), name="voice_name_unique_shared"),
        ]
        permissions = [("use_any_voice", "Can call with another user's private voice")]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        if not self.storage_key:
            self.storage_key = secrets.token_hex(12)
        super().save(*args, **kwargs)

    @property
    def usable(self) -> bool:
        """Whether a new call may use this voice."""
        return self.status == self.Status.READY


class VoicePrompt(models.Model):
    """A voice's processed prompt for one engine family and model, as a safetensors file.

    ``model_key`` names what the prompt was computed with (the Mimi weights for lockstep codes, the
    checkpoint for the unit engine's embedding); a prompt is used only by an engine with the same key.
    """

    voice = models.ForeignKey(Voice, on_delete=models.CASCADE, related_name="prompts")
    family = models.CharField(max_length=20)
    model_key = models.CharField(max_length=80)
    file = models.FileField(upload_to="voice-prompts/", max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["voice", "family", "model_key"], name="voice_prompt_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.voice.name} ({self.family})"
