from django.urls import path

from webapp.personas import views

app_name = "personas"

urlpatterns = [
    path("personas/", views.persona_list, name="persona-list"),
    path("personas/new/", views.persona_create, name="persona-create"),
    path("personas/<int:pk>/edit/", views.persona_edit, name="persona-edit"),
    path("personas/<int:pk>/archive/", views.persona_archive, name="persona-archive"),
    path("personas/<int:pk>/versions/", views.persona_versions, name="persona-versions"),
    path("voices/", views.voice_list, name="voice-list"),
    path("voices/new/", views.voice_new, name="voice-new"),
    path("voices/<int:pk>/", views.voice_detail, name="voice-detail"),
    path("voices/<int:pk>/status/", views.voice_status, name="voice-status"),
    path("voices/<int:pk>/preview/", views.voice_preview, name="voice-preview"),
    path("voices/<int:pk>/disable/", views.voice_disable, name="voice-disable"),
    path("voices/<int:pk>/retry/", views.voice_retry, name="voice-retry"),
    path("voices/<int:pk>/delete/", views.voice_delete, name="voice-delete"),
]
