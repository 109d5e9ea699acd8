"""Admin for personas (with their versions, read-only) and voices (status, consent, prompts)."""

from django.contrib import admin
from django.utils import timezone

from webapp.personas.models import Persona, PersonaVersion, Voice, VoicePrompt


class PersonaVersionInline(admin.TabularInline):
    model = PersonaVersion
    extra = 0
    can_delete = False
    fields = ("number", "name", "instructions", "default_voice", "created_by", "created_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # versions are made by saving the persona


@admin.register(Persona)
class PersonaAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "version", "archived", "updated_at")
    list_filter = ("archived",)
    search_fields = ("name", "instructions")
    readonly_fields = ("version",)
    inlines = [PersonaVersionInline]

    def save_model(self, request, obj, form, change) -> None:
        obj.save(edited_by=request.user)


class VoicePromptInline(admin.TabularInline):
    model = VoicePrompt
    extra = 0
    can_delete = False
    fields = ("family", "model_key", "file", "created_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # prompts are computed by the voice task


@admin.register(Voice)
class VoiceAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "kind", "status", "duration_s", "consented_by", "created_at")
    list_filter = ("kind", "status")
    search_fields = ("name",)
    readonly_fields = (
        "status",
        "failure_reason",
        "progress_stage",
        "progress_percent",
        "duration_s",
        "consent_text",
        "consent_phrase",
        "consented_by",
        "consented_at",
        "created_by",
        "disabled_by",
        "disabled_at",
    )
    inlines = [VoicePromptInline]
    actions = ["disable_voices"]

    @admin.action(description="Disable the selected voices (no new calls may use them)")
    def disable_voices(self, request, queryset) -> None:
        queryset.update(status=Voice.Status.DISABLED, disabled_by=request.user, disabled_at=timezone.now())
