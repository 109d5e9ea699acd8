"""Minimal persona and voice rows. ``owner`` null means shared with every user."""

from django.conf import settings
from django.db import models


class Persona(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="personas"
    )
    name = models.CharField(max_length=100)
    instructions = models.TextField(help_text="The persona text given to the model (system prompt).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Voice(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="voices"
    )
    name = models.CharField(max_length=100)
    file_path = models.CharField(
        max_length=500, blank=True, help_text="A voice prompt (.pt/.safetensors) or reference audio (.wav/.npy)."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
