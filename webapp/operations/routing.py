from django.urls import path

from webapp.operations.consumers import ConsoleConsumer

websocket_urlpatterns = [path("ops/live", ConsoleConsumer.as_asgi())]
