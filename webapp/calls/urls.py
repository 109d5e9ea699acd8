from django.urls import path

from webapp.calls import views

app_name = "calls"

urlpatterns = [
    path("", views.call_page, name="call"),
    path("call/warm-start", views.warm_start, name="warm-start"),
]
