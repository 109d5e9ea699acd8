from django.contrib.auth import views as auth_views
from django.urls import path

from webapp.accounts import views

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("signup/", views.signup, name="signup"),
    path("keys/", views.api_keys, name="api-keys"),
    path("keys/<int:pk>/revoke/", views.api_key_revoke, name="api-key-revoke"),
    path("invites/", views.invites, name="invites"),
]
