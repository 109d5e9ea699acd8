"""What callers expect of a call page: microphone and speaker pickers, mute, the agent's volume, a denied
microphone explained once with how to allow it, meters and charts with text values for a screen reader, a
visible focus ring; the login and sign-up pages say what Parley is."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.pages import hooks, login, open_call_page, start_call, wait_for, wait_for_state

pytestmark = pytest.mark.browser


def test_pickers_mute_volume_and_text_values_during_a_call(channels_live_server, page, make_user):
    url = channels_live_server.url
    make_user("controls")
    login(page, url, "controls")
    open_call_page(page, url)
    microphones = page.locator("#mic-device option")
    expect(microphones.first).to_have_text("System default")
    start_call(page)
    assert microphones.count() >= 2  # chromium's fake microphone, named once the page may use it
    expect(page.locator("#mic-device")).to_be_disabled()  # the microphone was opened at Start
    wait_for(page, "p.audioChunksReceived > 5 && p.micRms > 0.001")
    meter = page.locator("#mic-meter")
    expect(meter).to_have_attribute("aria-valuetext", re.compile(r"^-\d+ dBFS$"))
    expect(page.locator("#latency-summary")).to_contain_text("Latest: mouth-to-ear")

    page.get_by_role("button", name="Mute").click()
    expect(page.locator("#mute")).to_have_attribute("aria-pressed", "true")
    wait_for(page, "p.muted && p.micRms < 1e-5")  # silence goes up; the call goes on
    expect(meter).to_have_attribute("aria-valuetext", "silence")
    frames = hooks(page)["framesSent"]
    wait_for(page, f"p.framesSent > {frames + 10}")
    page.get_by_role("button", name="Unmute").click()
    wait_for(page, "!p.muted && p.micRms > 0.001")

    page.locator("#volume").fill("0.5")
    expect(page.locator("#volume-value")).to_have_text("50 %")
    assert hooks(page)["outputVolume"] == 0.5
    assert page.evaluate("() => document.getElementById('volume').getAttribute('aria-valuetext')") == "50 %"
    page.click("#stop")
    wait_for_state(page, "closed")


def test_a_denied_microphone_is_explained_once_with_how_to_allow_it(channels_live_server, page, make_user):
    url = channels_live_server.url
    make_user("denied")
    # What a browser does when the person (or a site setting) blocks the microphone.
    page.add_init_script(
        "navigator.mediaDevices.getUserMedia = () => Promise.reject(new DOMException('Permission denied', 'NotAllowedError'));"
    )
    login(page, url, "denied")
    open_call_page(page, url)
    page.click("#start")
    wait_for_state(page, "failed")
    expect(page.locator("#notice")).to_contain_text("set Microphone to Allow")
    assert page.get_by_text("Parley may not use your microphone").count() == 1  # said once, not twice
    assert "Permission denied" not in page.locator("main").inner_text()


def test_focus_is_visible_and_the_login_page_says_what_parley_is(channels_live_server, page):
    url = channels_live_server.url
    page.goto(f"{url}/accounts/login/")
    expect(page.locator("#about-parley")).to_contain_text("talk with a speech model")
    page.goto(f"{url}/accounts/signup/")
    expect(page.locator("#about-parley")).to_be_visible()
    page.keyboard.press("Tab")  # the first link, reached by keyboard
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
    width = page.evaluate("() => parseFloat(getComputedStyle(document.activeElement).outlineWidth)")
    assert outline != "none" and width >= 2
