from django.urls import path

from webapp.conversations.consumers import RealtimeConsumer

websocket_urlpatterns = [path("v1/realtime", RealtimeConsumer.as_asgi())]
