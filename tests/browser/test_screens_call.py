"""The call page as a caller sees it: the saved persona and its voice are chosen when the page opens, the page
names what the session runs with (from session.updated), and the recording names the same persona and voice.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.pages import login, open_call_page, start_call, wait_for, wait_for_state
from tests.browser.site_pages import seed_site
from webapp.recordings.models import Recording

pytestmark = pytest.mark.browser


def test_a_saved_persona_s_default_voice_is_chosen_when_the_page_opens(channels_live_server, page, make_user):
    url = channels_live_server.url
    seeded = seed_site(make_user)
    login(page, url, seeded.username)
    open_call_page(page, url)
    expect(page.locator("#persona-preset")).to_have_value(str(seeded.persona.pk))
    expect(page.locator("#voice")).to_have_value(str(seeded.voice.pk))  # before any change of the selection


def test_the_call_and_its_recording_name_the_persona_version_and_voice(
    channels_live_server, page, make_user, screenshot_dir
):
    url = channels_live_server.url
    seeded = seed_site(make_user)
    login(page, url, seeded.username)
    open_call_page(page, url)
    session_id = start_call(page)
    wait_for(page, "p.sessionNames !== null && p.audioChunksReceived > 3")
    expect(page.locator("#persona-shown")).to_have_text("Museum guide (version 1)")
    expect(page.locator("#voice-shown")).to_have_text("Calm narrator")
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "call-live-names.png"), full_page=True)
    page.click("#stop")
    wait_for_state(page, "closed")

    recording = Recording.objects.get(session_id=session_id)
    assert (recording.persona_name, recording.persona_version, recording.voice) == ("Museum guide", 1, "Calm narrator")
    page.goto(f"{url}/recordings/{recording.pk}/")
    facts = page.locator("#meta-title + dl.facts")
    expect(facts).to_contain_text("Museum guide (version 1)")
    expect(facts).to_contain_text("Calm narrator")


def test_after_hang_up_the_page_says_why_in_words_and_links_to_the_recording(
    channels_live_server, page, make_user, screenshot_dir
):
    url = channels_live_server.url
    seeded = seed_site(make_user)
    login(page, url, seeded.username)
    open_call_page(page, url)
    session_id = start_call(page)
    wait_for(page, "p.recorded === true && p.audioChunksReceived > 3")
    page.click("#stop")
    wait_for_state(page, "closed")
    expect(page.locator("#call-state-detail")).to_have_text("You hung up.")
    link = page.get_by_role("link", name="Review the recording of this call")
    expect(link).to_be_visible()
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "call-ended.png"), full_page=True)
    link.click()
    recording = Recording.objects.get(session_id=session_id)
    page.wait_for_url(f"{url}/recordings/{recording.pk}/")
    expect(page.locator("#close-reason")).to_have_text("You hung up.")
