from django.contrib import admin

from webapp.accounts.models import ApiKey, Invite
from webapp.accounts.services import invite_create


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "name", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("prefix", "user__username", "name")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")

    def has_add_permission(self, request):  # keys are created in the UI or by createapikey (shown once)
        return False


@admin.register(Invite)
class InviteAdmin(admin.ModelAdmin):
    list_display = ("code", "note", "created_by", "created_at", "used_by", "used_at")
    readonly_fields = ("code", "created_by", "created_at", "used_by", "used_at")
    fields = ("note", "code", "created_by", "created_at", "used_by", "used_at")

    def save_model(self, request, obj, form, change):
        if not change:  # a new invite gets a generated code through the service
            created = invite_create(created_by=request.user, note=obj.note)
            obj.pk, obj.code, obj.created_at = created.pk, created.code, created.created_at
            return
        super().save_model(request, obj, form, change)
