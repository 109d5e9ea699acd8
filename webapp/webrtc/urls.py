from django.urls import path

from webapp.webrtc import views

app_name = "webrtc"

urlpatterns = [
    path("v1/realtime/calls", views.realtime_calls, name="calls"),
]
