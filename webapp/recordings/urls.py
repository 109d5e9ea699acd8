from django.urls import path

from webapp.recordings import review_urls, views

urlpatterns = [
    path("", views.recording_list, name="recording-list"),
    path("status.json", views.recording_statuses, name="recording-statuses"),
    path("<int:recording_id>/", views.recording_detail, name="recording-detail"),
    path("session/<str:session_id>/", views.recording_of_session, name="recording-of-session"),
    path("<int:recording_id>/status.json", views.recording_status, name="recording-status"),
    path("<int:recording_id>/files/<str:kind>", views.recording_file, name="recording-file"),
    path("<int:recording_id>/download.zip", views.recording_zip, name="recording-zip"),
    path("<int:recording_id>/delete", views.recording_delete_view, name="recording-delete"),
    *review_urls.urlpatterns,  # annotations, ratings, tags, shares, exports
]
