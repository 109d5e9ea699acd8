from django.apps import AppConfig


class PersonasConfig(AppConfig):
    name = "webapp.personas"
    label = "personas"
