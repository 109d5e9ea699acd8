from django.contrib import admin

from webapp.personas.models import Persona, Voice


@admin.register(Persona)
class PersonaAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "created_at")
    search_fields = ("name", "instructions")


@admin.register(Voice)
class VoiceAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "file_path", "created_at")
    search_fields = ("name",)
