from django.urls import path

from webapp.recordings import replay_views, review_urls, views

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
    path("<int:recording_id>/frames/<int:index>", replay_views.recording_frame, name="recording-frame"),
    path("<int:recording_id>/replay", replay_views.recording_replay, name="recording-replay"),
    path("compare/<int:first_id>/<int:second_id>/", replay_views.recording_compare, name="recording-compare"),
]
