"""Thin views: sign-up by invite, API key management, staff invite page."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from webapp.accounts.forms import ApiKeyCreateForm, InviteCreateForm, InviteSignupForm
from webapp.accounts.models import ApiKey, Invite
from webapp.accounts.services import apikey_create, apikey_revoke, invite_create, invite_redeem
from webapp.common.errors import ApplicationError


def signup(request: HttpRequest) -> HttpResponse:
    form = InviteSignupForm(request.POST or None, initial={"invite_code": request.GET.get("code", "")})
    if request.method == "POST" and form.is_valid():
        try:
            user = invite_redeem(
                code=form.cleaned_data["invite_code"],
                username=form.cleaned_data["username"],
                password=form.cleaned_data["password1"],
            )
        except ApplicationError as exc:
            form.add_error("invite_code", exc.message)
        else:
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            return redirect("/")
    return render(request, "registration/signup.html", {"form": form})


NEW_KEY_SESSION_KEY = "new_api_key"


@login_required
def api_keys(request: HttpRequest) -> HttpResponse:
    form = ApiKeyCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        _, new_key = apikey_create(user=request.user, name=form.cleaned_data["name"])
        # Redirect after POST, so a reload cannot make a second key; the raw key rides in the session to the
        # next page, which shows it once and forgets it (it is never stored with the key).
        request.session[NEW_KEY_SESSION_KEY] = new_key
        return redirect("api-keys")
    new_key = request.session.pop(NEW_KEY_SESSION_KEY, None) if request.method == "GET" else None
    keys = ApiKey.objects.filter(user=request.user)
    return render(request, "accounts/api_keys.html", {"form": form, "keys": keys, "new_key": new_key})


@login_required
@require_POST
def api_key_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    api_key = get_object_or_404(ApiKey, pk=pk, user=request.user)  # scoped by owner
    apikey_revoke(api_key=api_key)
    messages.info(request, f"Key {api_key.prefix}… revoked.")
    return redirect("api-keys")


@login_required
def invites(request: HttpRequest) -> HttpResponse:
    # A signed-in user without the right gets a 403 page that says so (not the admin's login form).
    if not (request.user.is_staff and request.user.has_perm("accounts.add_invite")):
        raise PermissionDenied("Only staff with the right to invite people can see and create invites.")
    form = InviteCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        invite = invite_create(created_by=request.user, note=form.cleaned_data["note"])
        messages.info(request, f"Invite created: {invite.code}")
        return redirect("invites")
    signup_url = request.build_absolute_uri(reverse("signup"))
    return render(
        request,
        "accounts/invites.html",
        {"form": form, "invites": Invite.objects.all()[:100], "signup_url": signup_url},
    )
