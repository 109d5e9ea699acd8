from django.urls import path

from webapp.operations import console_views, measures_views, metrics, views

app_name = "operations"

urlpatterns = [
    path("", views.occupancy_page, name="occupancy"),
    path("workers/", views.occupancy_fragment, name="occupancy-fragment"),
    path("occupancy.json", views.occupancy_json, name="occupancy-json"),
    path("sessions/<str:session_id>/end/", views.session_end, name="session-end"),
    path("console/", console_views.console_page, name="console"),
    path("console/sessions/<str:session_id>/end/", console_views.end_session, name="console-end-session"),
    path("console/services/<str:service_id>/drain/", console_views.drain_service, name="console-drain"),
    path("console/admission/", console_views.admission, name="console-admission"),
    path("console/voices/<str:voice_id>/disable/", console_views.disable_voice, name="console-disable-voice"),
    path("metrics", metrics.metrics, name="metrics"),
    path("measures/", measures_views.measures_page, name="measures"),
]
