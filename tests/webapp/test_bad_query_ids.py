"""Ids in query strings that ``str.isdigit`` accepts but ``int()`` refuses never become a server error."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_recording_statuses_ignore_ids_that_are_not_plain_numbers():
    user = get_user_model().objects.create_user(username="ids", password="pw-for-tests-only")
    client = Client()
    client.force_login(user)
    url = reverse("recording-statuses")
    for ids in ("\u00b2", "\u0661\u0662", "9" * 5000, "9" * 30, "1,\u00b2,2", " 3 ,x,,-4"):
        response = client.get(url, {"ids": ids})
        assert response.status_code == 200, ids
        assert response.json() == {"recordings": []}, ids
