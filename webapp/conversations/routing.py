from django.urls import path

from webapp.conversations.consumers import RealtimeConsumer

REALTIME_PATHS = ("/v1/realtime",)  # the calls' socket: what a busy process turns away (common.loop_load)

websocket_urlpatterns = [path("v1/realtime", RealtimeConsumer.as_asgi())]
