from django.apps import AppConfig


class CallsConfig(AppConfig):
    name = "webapp.calls"
    label = "calls"
