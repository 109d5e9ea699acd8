"""Thin views: sign-up by invite, API key management, staff invite page."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
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


@login_required
def api_keys(request: HttpRequest) -> HttpResponse:
    form = ApiKeyCreateForm(request.POST or None)
    new_key = None
    if request.method == "POST" and form.is_valid():
        _, new_key = apikey_create(user=request.user, name=form.cleaned_data["name"])
        form = ApiKeyCreateForm()
    keys = ApiKey.objects.filter(user=request.user)
    # The raw key is rendered in this one response only; it is not stored anywhere.
    return render(request, "accounts/api_keys.html", {"form": form, "keys": keys, "new_key": new_key})


@login_required
@require_POST
def api_key_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    api_key = get_object_or_404(ApiKey, pk=pk, user=request.user)  # scoped by owner
    apikey_revoke(api_key=api_key)
    messages.info(request, f"Key {api_key.prefix}… revoked.")
    return redirect("api-keys")


@staff_member_required
@permission_required("accounts.add_invite", raise_exception=True)  # staff alone is not enough: 403
def invites(request: HttpRequest) -> HttpResponse:
    form = InviteCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        invite = invite_create(created_by=request.user, note=form.cleaned_data["note"])
        messages.info(request, f"Invite created: {invite.code}")
        return redirect("invites")
    signup_url = request.build_absolute_uri("/accounts/signup/")
    return render(
        request,
        "accounts/invites.html",
        {"form": form, "invites": Invite.objects.all()[:100], "signup_url": signup_url},
    )
