"""Keys and invites in the browser: a new key is shown once with a Copy button, and reloading makes no second key;
a signed-in user who may not invite gets a page saying so, not the admin's login."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.pages import login
from webapp.accounts.models import ApiKey

pytestmark = pytest.mark.browser


def test_a_new_key_is_shown_once_copied_and_a_reload_makes_no_second_key(channels_live_server, browser, make_user):
    url = channels_live_server.url
    user = make_user("key_maker")
    context = browser.new_context()
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
    page = context.new_page()
    login(page, url, "key_maker")
    page.goto(f"{url}/accounts/keys/")
    page.fill("input[name=name]", "laptop")
    page.get_by_role("button", name="Create key").click()
    page.wait_for_url(f"{url}/accounts/keys/")
    raw_key = page.locator("#new-api-key").inner_text().strip()
    assert raw_key.startswith("pk_")
    page.get_by_role("button", name="Copy key").click()
    expect(page.locator("#copy-api-key")).to_have_text("Copied")
    assert page.evaluate("() => navigator.clipboard.readText()") == raw_key
    page.reload()
    expect(page.locator("#new-api-key")).to_have_count(0)  # shown once
    assert ApiKey.objects.filter(user=user).count() == 1  # the reload posted nothing
    context.close()


def test_a_user_who_may_not_invite_is_told_so(channels_live_server, page, make_user):
    url = channels_live_server.url
    make_user("no_inviter")
    login(page, url, "no_inviter")
    response = page.goto(f"{url}/accounts/invites/")
    assert response.status == 403 and "/admin/" not in page.url
    expect(page.get_by_role("heading")).to_have_text("You may not open this page")
    expect(page.locator("#forbidden-reason")).to_contain_text("right to invite")
