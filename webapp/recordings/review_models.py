"""Review rows kept beside a recording: span labels, ratings, tags, shares with reviewers, and exports.

A recording's review is other people's work on it, so every row names its author; none of them is
copied into the ``Recording`` row, which post-processing owns.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models

# Rows point at "recordings.Recording" by name: models.py imports this module (to register it), not the reverse.
RECORDING = "recordings.Recording"


class Label(models.Model):
    """One entry of the configurable label set a reviewer picks from (seeded by a data migration)."""

    name = models.CharField(max_length=60, unique=True)
    description = models.CharField(max_length=200, blank=True)
    position = models.PositiveIntegerField(default=0)  # order in the picker
    active = models.BooleanField(default=True)  # retired labels stay on old annotations but leave the picker

    class Meta:
        ordering = ["position", "name"]

    def __str__(self) -> str:
        return self.name


class Annotation(models.Model):
    """A labelled span of a call's timeline (seconds on the recording's clock), with an optional note."""

    recording = models.ForeignKey(RECORDING, on_delete=models.CASCADE, related_name="annotations")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    label = models.ForeignKey(Label, on_delete=models.PROTECT, related_name="annotations")
    start_s = models.FloatField()
    end_s = models.FloatField()
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["start_s", "pk"]

    def __str__(self) -> str:
        return f"{self.label} {self.start_s:.1f}-{self.end_s:.1f} s"


class Rating(models.Model):
    """One reviewer's 1-5 rating of a call (a second rating by the same reviewer replaces the first)."""

    recording = models.ForeignKey(RECORDING, on_delete=models.CASCADE, related_name="ratings")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    stars = models.PositiveSmallIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["recording", "author"], name="one_rating_per_reviewer"),
            models.CheckConstraint(condition=models.Q(stars__gte=1, stars__lte=5), name="rating_one_to_five"),
        ]


class Tag(models.Model):
    name = models.CharField(max_length=40, unique=True)  # lower case, see annotations.tag_name

    def __str__(self) -> str:
        return self.name


class RecordingTag(models.Model):
    recording = models.ForeignKey(RECORDING, on_delete=models.CASCADE, related_name="tagged")
    tag = models.ForeignKey(Tag, on_delete=models.CASCADE, related_name="tagged")
    added_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")

    class Meta:
        ordering = ["tag__name"]
        constraints = [models.UniqueConstraint(fields=["recording", "tag"], name="tag_once_per_recording")]


class RecordingShare(models.Model):
    """A recording shown to the reviewers group, or to one named reviewer (exactly one of the two)."""

    recording = models.ForeignKey(RECORDING, on_delete=models.CASCADE, related_name="shares")
    group = models.ForeignKey(Group, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    shared_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(group__isnull=True) ^ models.Q(reviewer__isnull=True), name="share_one_audience"
            ),
            models.UniqueConstraint(fields=["recording", "group"], name="share_group_once"),
            models.UniqueConstraint(fields=["recording", "reviewer"], name="share_reviewer_once"),
        ]


class EvaluationExport(models.Model):
    """An evaluation set built from a filtered selection of recordings (``export.py``), kept as a zip."""

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        READY = "ready", "ready"
        FAILED = "failed", "failed"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="exports")
    query = models.JSONField(default=dict, blank=True)  # the list page's filters, as submitted
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    progress = models.FloatField(default=0.0)
    reason = models.TextField(blank=True)
    calls = models.PositiveIntegerField(default=0)
    file = models.CharField(max_length=300, blank=True)  # storage name of the zip
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
