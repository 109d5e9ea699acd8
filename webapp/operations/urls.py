from django.urls import path

from webapp.operations import views

app_name = "operations"

urlpatterns = [
    path("", views.occupancy_page, name="occupancy"),
    path("workers/", views.occupancy_fragment, name="occupancy-fragment"),
    path("occupancy.json", views.occupancy_json, name="occupancy-json"),
    path("sessions/<str:session_id>/end/", views.session_end, name="session-end"),
]
