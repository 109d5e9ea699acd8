from django.contrib import admin

from webapp.conversations.models import Conversation


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("session_id", "user", "engine", "status", "close_reason", "started_at", "ended_at")
    list_filter = ("status", "engine", "close_reason")
    search_fields = ("session_id", "user__username")
    readonly_fields = ("session_id", "user", "engine", "started_at", "ended_at")
