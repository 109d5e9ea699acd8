"""Accounts: login/logout, invite sign-up, API keys in the UI and from manage.py, bootstrap."""

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client

from webapp.accounts.models import ApiKey, Invite
from webapp.accounts.services import apikey_authenticate, apikey_hash, invite_create

pytestmark = pytest.mark.django_db
User = get_user_model()


@pytest.fixture
def alice():
    return User.objects.create_user(username="alice", password="a-long-password-1")


def test_login_and_logout(alice):
    client = Client()
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b'name="username"' in page.content
    response = client.post("/accounts/login/", {"username": "alice", "password": "a-long-password-1"})
    assert response.status_code == 302
    assert client.get("/accounts/keys/").status_code == 200
    client.post("/accounts/logout/")
    assert client.get("/accounts/keys/").status_code == 302  # back to the login page

    bad = Client().post("/accounts/login/", {"username": "alice", "password": "wrong"})
    assert bad.status_code == 200 and b"did not match" in bad.content


def test_sign_up_with_an_invite_spends_it(alice):
    invite = invite_create(created_by=alice, note="for bob")
    client = Client()
    form = {
        "invite_code": invite.code,
        "username": "bob",
        "password1": "Sup3r-secret-pw",
        "password2": "Sup3r-secret-pw",
    }
    assert client.post("/accounts/signup/", form).status_code == 302
    bob = User.objects.get(username="bob")
    assert bob.check_password("Sup3r-secret-pw")
    invite.refresh_from_db()
    assert invite.used_by == bob and invite.is_used
    assert client.get("/accounts/keys/").status_code == 200  # logged in after sign-up

    again = Client().post("/accounts/signup/", {**form, "username": "carol"})
    assert again.status_code == 200 and b"not valid or has already been used" in again.content
    assert not User.objects.filter(username="carol").exists()


def test_sign_up_with_a_wrong_code_creates_nothing():
    form = {
        "invite_code": "nope",
        "username": "mallory",
        "password1": "Sup3r-secret-pw",
        "password2": "Sup3r-secret-pw",
    }
    response = Client().post("/accounts/signup/", form)
    assert response.status_code == 200 and not User.objects.filter(username="mallory").exists()


def test_api_key_page_shows_a_new_key_once_and_revokes(alice):
    client = Client()
    client.force_login(alice)
    response = client.post("/accounts/keys/", {"name": "laptop"}, follow=True)
    assert response.redirect_chain == [("/accounts/keys/", 302)]  # redirect after POST: a reload makes no second key
    raw_key = re.search(rb'id="new-api-key">([^<]+)<', response.content).group(1).decode()
    assert b'id="copy-api-key"' in response.content
    key = ApiKey.objects.get(user=alice)
    assert key.name == "laptop" and raw_key.startswith(key.prefix)
    assert key.key_hash == apikey_hash(raw_key) and raw_key not in key.key_hash  # only the hash is stored
    assert apikey_authenticate(raw_key=raw_key) == alice

    listing = client.get("/accounts/keys/")  # shown once: the session forgot it
    assert raw_key.encode() not in listing.content and key.prefix.encode() in listing.content
    assert ApiKey.objects.filter(user=alice).count() == 1

    intruder = User.objects.create_user(username="eve", password="x-long-password-2")
    other = Client()
    other.force_login(intruder)
    assert other.post(f"/accounts/keys/{key.pk}/revoke/").status_code == 404  # scoped by owner

    client.post(f"/accounts/keys/{key.pk}/revoke/")
    key.refresh_from_db()
    assert key.revoked_at is not None and apikey_authenticate(raw_key=raw_key) is None


def test_createapikey_prints_a_working_key_once(alice):
    out = io.StringIO()
    call_command("createapikey", "alice", stdout=out)
    raw_key = out.getvalue().strip()
    assert apikey_authenticate(raw_key=raw_key) == alice
    assert ApiKey.objects.filter(user=alice).count() == 1
    with pytest.raises(CommandError):
        call_command("createapikey", "nobody", stdout=io.StringIO())


def test_invalid_keys_do_not_authenticate(alice):
    assert apikey_authenticate(raw_key="") is None
    assert apikey_authenticate(raw_key="pk_" + "x" * 500) is None
    assert apikey_authenticate(raw_key="Bearer nonsense") is None


def test_bootstrap_creates_the_admin_once(settings, tmp_path):
    settings.PARLEY_ADMIN_PASSWORD_FILE = tmp_path / "admin-password.txt"
    out = io.StringIO()
    call_command("bootstrap", "--url", "http://127.0.0.1:8123/", stdout=out)
    text = out.getvalue()
    password = re.search(r"password: (\S+)", text).group(1)
    assert "http://127.0.0.1:8123/accounts/login/" in text and "username: admin" in text
    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.check_password(password)
    assert settings.PARLEY_ADMIN_PASSWORD_FILE.read_text().split() == ["admin", password]
    assert settings.PARLEY_ADMIN_PASSWORD_FILE.stat().st_mode & 0o077 == 0

    out = io.StringIO()
    call_command("bootstrap", stdout=out)
    assert password not in out.getvalue() and str(settings.PARLEY_ADMIN_PASSWORD_FILE) in out.getvalue()
    assert User.objects.filter(is_superuser=True).count() == 1


def test_staff_create_invites_on_their_page(alice):
    staff = User.objects.create_user(username="staff", password="s-long-password-3", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="add_invite"))
    client = Client()
    client.force_login(alice)
    refused = client.get("/accounts/invites/")  # not staff: a page that says why, not the admin's login form
    assert refused.status_code == 403 and b"right to invite" in refused.content and b"/admin/login" not in refused.content
    client.force_login(staff)
    client.post("/accounts/invites/", {"note": "for dave"})
    invite = Invite.objects.get(note="for dave")
    page = client.get("/accounts/invites/").content.decode()
    link = f"http://testserver/accounts/signup/?code={invite.code}"
    assert link in page  # a sign-up link with the code filled in
    signup = client.get(link)
    assert f'value="{invite.code}"' in signup.content.decode()
