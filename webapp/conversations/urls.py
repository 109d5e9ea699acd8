from django.urls import path

from webapp.conversations import views

urlpatterns = [path("v1/realtime/client_secrets", views.client_secret_mint, name="realtime-client-secrets")]
