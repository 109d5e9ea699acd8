"""A live caller is told in words when the server falls behind, and told again when it has caught up.

The live server's echo engine takes 200 ms over each 80 ms tick for the first seconds after a slot
opens (``PARLEY_TEST_ECHO_SLOW_TICK_MS``, ``PARLEY_TEST_ECHO_SLOW_FOR_S``): ticks run late and audio
queues up, as on an overloaded host. The server says so with ``session.status`` and the call page
shows the sentence, not only the counters; when the engine keeps time again the line goes away.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.pages import hooks, login, open_call_page, start_call, wait_for
from tests.live_server import live_server_env, run_live_server

pytestmark = pytest.mark.browser

SLOW_FOR_S = 8


@pytest.fixture(scope="module")
def slow_engine_server(django_db_setup, django_db_blocker):
    env = live_server_env("echo", PARLEY_TEST_ECHO_SLOW_TICK_MS="200", PARLEY_TEST_ECHO_SLOW_FOR_S=str(SLOW_FOR_S))
    with run_live_server(django_db_blocker, env) as server:
        yield server


def test_the_call_page_says_in_words_that_the_server_is_behind_then_clears_it(
    slow_engine_server, browser, make_user, screenshot_dir
):
    url = slow_engine_server.url
    make_user("overloaded-caller")
    page = browser.new_page()
    login(page, url, "overloaded-caller")
    open_call_page(page, url)
    status = page.locator("#server-status")
    expect(status).to_be_hidden()

    start_call(page)
    expect(status).to_have_text("The server is behind: audio may break up.", timeout=SLOW_FOR_S * 1000)
    expect(status).to_be_visible()
    assert hooks(page)["serverStatus"]["code"] == "server_behind"
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "call-server-behind.png"), full_page=True)

    # The engine keeps time again after SLOW_FOR_S; the queued audio drains and the line goes away.
    expect(status).to_be_hidden(timeout=(SLOW_FOR_S + 20) * 1000)
    assert hooks(page)["serverStatus"]["code"] == "server_caught_up"
    wait_for(page, "p.metrics !== null")
    page.click("#stop")
    page.close()
