"""Admin for the review rows: the label set is configured here (add, reorder, retire a label)."""

from django.contrib import admin

from webapp.recordings.review_models import Annotation, EvaluationExport, Label, RecordingShare


@admin.register(Label)
class LabelAdmin(admin.ModelAdmin):
    list_display = ("name", "description", "position", "active")
    list_editable = ("position", "active")


@admin.register(Annotation)
class AnnotationAdmin(admin.ModelAdmin):
    list_display = ("recording", "label", "start_s", "end_s", "author", "created_at")
    list_filter = ("label",)
    search_fields = ("note", "recording__session_id")


@admin.register(RecordingShare)
class RecordingShareAdmin(admin.ModelAdmin):
    list_display = ("recording", "group", "reviewer", "shared_by", "created_at")


@admin.register(EvaluationExport)
class EvaluationExportAdmin(admin.ModelAdmin):
    list_display = ("pk", "user", "status", "calls", "created_at")
    readonly_fields = ("query", "file", "progress")
