"""While something is prepared the page says how long it may take: a cloned voice's processing and a call's
persona-and-voice prefill show the time left, extrapolated from their progress. The progress is scripted here
(the voice's status answers, the call's server), so the pace is known."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from tests.browser.pages import login, open_call_page
from tests.browser.site_pages import seed_site
from tests.browser.test_page_protocol import ScriptedServer
from webapp.personas.models import Voice

pytestmark = pytest.mark.browser

CAPABILITIES = {"engine": "personaplex", "family": "lockstep", "chunk_period_ms": 80, "input_rates": [24000]}


def test_a_voice_being_prepared_shows_the_time_left(channels_live_server, page, make_user):
    url = channels_live_server.url
    seeded = seed_site(make_user)
    voice = Voice.objects.create(owner=seeded.voice.owner, name="Fresh clone", status=Voice.Status.PROCESSING)
    percents = iter([5, 10, 15, 20, 25, 30, 35, 40, 45, 50] + [50] * 1000)

    def status(route):
        body = {"id": voice.pk, "name": voice.name, "status": "processing", "stage": "lockstep: prompt",
                "percent": next(percents), "reason": "", "duration_s": 6.0, "prompts": []}  # fmt: skip
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    page.route(f"**/voices/{voice.pk}/status/", status)
    login(page, url, seeded.username)
    page.goto(f"{url}/voices/{voice.pk}/")
    # 5 % every poll (~0.4 s): about half of it left after ~4 s, so a few seconds, not minutes
    expect(page.locator("#voice-percent-label")).to_have_text(re.compile(r"^\d+ % · about \d+ s left$"), timeout=10_000)
    seconds = int(re.search(r"about (\d+) s", page.locator("#voice-percent-label").inner_text()).group(1))
    assert 1 <= seconds <= 20


def test_a_call_s_prefill_shows_the_time_left(channels_live_server, page, make_user):
    url = channels_live_server.url
    make_user("prefilled")
    server = ScriptedServer(page)
    login(page, url, "prefilled")
    open_call_page(page, url)
    page.click("#start")
    server.wait_for_sockets(1)
    server.sends({"type": "session.created", "session": {"id": "sess_prefill", "duplex": {"capabilities": CAPABILITIES}}})
    server.sends({"type": "session.prefill", "progress": 0.1, "done": False})
    expect(page.locator("#prefill-label")).to_contain_text("estimating the time left")
    for progress in (0.2, 0.3, 0.4):
        page.wait_for_timeout(400)
        server.sends({"type": "session.prefill", "progress": progress, "done": False})
    # 0.3 in ~1.2 s: the 0.6 left takes about 2-3 s
    expect(page.locator("#prefill-label")).to_have_text(re.compile(r"^40 % · about [1-9] s left$"))
    server.sends({"type": "session.prefill", "progress": 1.0, "done": True})
    expect(page.locator("#prefill")).to_be_hidden()
