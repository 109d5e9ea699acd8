"""The catalogue: one ``Recording`` row per recorded session, written at its edges and by post-processing."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from webapp.common.close_reasons import close_reason_words


class Recording(models.Model):
    class Status(models.TextChoices):
        RECORDING = "recording", "recording"
        PROCESSING = "processing", "processing"
        READY = "ready", "ready"
        PARTIAL = "partial", "partial (some of the call was lost; see the reason)"
        INTERRUPTED = "interrupted", "interrupted (the inference service stopped mid-call)"
        FAILED = "failed", "failed"

    PLAYABLE = (Status.READY, Status.PARTIAL, Status.INTERRUPTED)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="recordings")
    session_id = models.CharField(max_length=100, unique=True)
    # Persona facts are copied, not linked: a recording outlives edits and deletions of its persona,
    # and versions of personas are another app's business (their number is kept when it is known).
    persona_id = models.IntegerField(null=True, blank=True)
    persona_name = models.CharField(max_length=200, blank=True)
    persona_version = models.IntegerField(null=True, blank=True)
    voice = models.CharField(max_length=200, blank=True)
    engine = models.CharField(max_length=50)
    mode = models.CharField(max_length=20, default="duplex")  # duplex | half_duplex | chat (fixed at the first audio)
    checkpoint = models.CharField(max_length=500, blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    duration_s = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.RECORDING)
    status_reason = models.TextField(blank=True)
    progress = models.FloatField(default=0.0)  # post-processing, 0..1
    stage = models.CharField(max_length=40, blank=True)  # the post-processing step running now, in words; "" when none
    close_reason = models.CharField(max_length=30, blank=True)
    attempts = models.PositiveIntegerField(default=0)  # post-processing runs that failed on storage
    raw_bytes = models.BigIntegerField(default=0)
    stored_bytes = models.BigIntegerField(default=0)
    files = models.JSONField(default=dict, blank=True)  # kind -> storage name (ogg, wav, peaks, transcript, timeline)
    transcript_text = models.TextField(blank=True)  # for search
    # turn_taking.measure's result (latencies, overlaps, interruptions, backchannels, pauses, talk ratio),
    # or {"error": reason} when the call could not be measured; {} before post-processing.
    turn_taking = models.JSONField(default=dict, blank=True)
    # echo_leak.measure_echo's result: whether the agent's audio came back through the caller's microphone
    # (flagged, leak_db, delay_ms), or {"error": reason}; {} before post-processing.
    echo_leak = models.JSONField(default=dict, blank=True)
    # A replay (replay.py) is a recording of its own: its source call, and what it changed (persona, voice,
    # checkpoint, engine, pace, greedy) with its outcome (steps, seconds, whether the agent tokens matched).
    source = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replays")
    replay = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["user", "-started_at"]), models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"{self.session_id} ({self.user}, {self.status})"

    @property
    def checkpoint_name(self) -> str:
        """What the pages show of the checkpoint: its folder's name, not the server path (kept for operators)."""
        return self.checkpoint.rstrip("/").rsplit("/", 1)[-1]

    @property
    def close_reason_text(self) -> str:
        return close_reason_words(self.close_reason)

    @property
    def playable(self) -> bool:
        return self.status in self.PLAYABLE and bool(self.files)


# The review rows live in their own module; importing them here registers them with the app.
from webapp.recordings.review_models import (  # noqa: E402, F401
    Annotation,
    EvaluationExport,
    Label,
    Rating,
    RecordingShare,
    RecordingTag,
    Tag,
)
