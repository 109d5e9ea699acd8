"""Routes of the review panel and the evaluation-set export (``review_views``)."""

from django.urls import path

from webapp.recordings import review_views

urlpatterns = [
    path("<int:recording_id>/annotations/", review_views.annotation_add_view, name="annotation-add"),
    path(
        "<int:recording_id>/annotations/<int:annotation_id>/delete",
        review_views.annotation_delete_view,
        name="annotation-delete",
    ),  # fmt: skip
    path("<int:recording_id>/rating", review_views.rating_view, name="recording-rate"),
    path("<int:recording_id>/tags/", review_views.tag_add_view, name="recording-tag"),
    path("<int:recording_id>/tags/<int:tagged_id>/delete", review_views.tag_remove_view, name="recording-untag"),
    path("<int:recording_id>/shares/", review_views.share_view, name="recording-share"),
    path("<int:recording_id>/shares/<int:share_id>/delete", review_views.unshare_view, name="recording-unshare"),
    path("export/", review_views.export_view, name="recording-export"),
    path("export/<int:export_id>/status.json", review_views.export_status, name="recording-export-status"),
    path("export/<int:export_id>/evaluation-set.zip", review_views.export_file, name="recording-export-file"),
]
