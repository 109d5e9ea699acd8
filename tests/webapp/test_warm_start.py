"""The warm start's web side: off under the test settings, and its status for the call page (login only)."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from webapp.calls.warm_start import begin_warm_start

pytestmark = pytest.mark.django_db


def test_the_test_settings_start_no_warm_start():
    assert begin_warm_start() is False


def test_the_call_page_reads_the_warm_start_status_when_logged_in():
    url = reverse("calls:warm-start")
    client = Client()
    assert client.get(url).status_code == 302  # to the login page
    client.force_login(get_user_model().objects.create_user(username="warm", password="pw-for-tests-only"))
    assert client.get(url).json() == {"state": "off", "stage": ""}
    page = client.get(reverse("calls:call"))
    assert b'id="warm-start"' in page.content and b'data-warm-start-url="/call/warm-start"' in page.content
