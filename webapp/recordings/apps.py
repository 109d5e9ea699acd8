from django.apps import AppConfig


class RecordingsConfig(AppConfig):
    name = "webapp.recordings"
    label = "recordings"
    verbose_name = "Recordings"
