"""A refusal closes the page's call with words that fit it, through a real daphne: the close code it gets
(docs/protocol.md) is one daphne can send, and the page does not offer to "resume" a call that was refused."""

from __future__ import annotations

import pytest
from django.test import override_settings
from playwright.sync_api import expect

from tests.browser.pages import login, open_call_page, start_call, wait_for_state
from tests.live_server import live_server_env, run_live_server

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def one_connect_a_minute(django_db_setup, django_db_blocker):
    """Each account may connect once a minute (the child keeps the settings it was forked with)."""
    with override_settings(PARLEY_CONNECTS_PER_USER_PER_MINUTE=1, PARLEY_RATE_LIMIT_STORAGE="async+memory://"):
        with run_live_server(django_db_blocker, live_server_env("echo")) as server:
            yield server


def test_a_caller_over_the_connect_limit_is_told_to_wait_not_to_resume(one_connect_a_minute, browser, make_user):
    url = one_connect_a_minute.url
    make_user("eager-caller")
    page = browser.new_page()
    login(page, url, "eager-caller")
    open_call_page(page, url)
    start_call(page)
    page.click("#stop")
    wait_for_state(page, "closed")

    page.click("#start")  # the second connect within the minute
    wait_for_state(page, "failed")
    expect(page.locator("#notice")).to_contain_text("rate_limit_exceeded")
    expect(page.locator("#call-state-detail")).to_have_text("Too many connections: wait a minute, then start again.")
    page.close()
