from django.contrib import admin

from webapp.recordings.models import Recording


@admin.register(Recording)
class RecordingAdmin(admin.ModelAdmin):
    list_display = ("session_id", "user", "engine", "persona_name", "status", "duration_s", "started_at")
    list_filter = ("status", "engine")
    search_fields = ("session_id", "user__username", "persona_name", "voice")
    readonly_fields = ("files", "raw_bytes", "stored_bytes", "attempts", "progress")

from webapp.recordings import review_admin  # noqa: E402, F401 - registers the review rows' admin
