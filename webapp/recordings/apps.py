from django.apps import AppConfig


class RecordingsConfig(AppConfig):
    name = "webapp.recordings"
    label = "recordings"
    verbose_name = "Recordings"

    def ready(self) -> None:
        from webapp.recordings import replay  # noqa: F401 - registers the replay task with Celery
