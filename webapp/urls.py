from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("webapp.accounts.urls")),
    path("ops/", include("webapp.operations.urls")),
    path("recordings/", include("webapp.recordings.urls")),
    path("", include("webapp.conversations.urls")),
    path("", include("webapp.personas.urls")),
    path("", include("webapp.calls.urls")),
    path("", include("webapp.webrtc.urls")),
]
