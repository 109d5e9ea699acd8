"""Voices as their owner sees them: a clip under the minimum is refused before any upload; a failed voice shows no
progress bar stuck part-way and can be tried again or deleted; a ready voice says "ready" once and offers
"Use in a call", which opens the call page with it chosen."""

from __future__ import annotations

import io
import math
import struct
import wave

import pytest
from django.core.files.base import ContentFile
from playwright.sync_api import expect

from tests.browser.pages import login
from tests.browser.site_pages import seed_site
from webapp.personas.models import Voice

pytestmark = pytest.mark.browser


def tone_wav(seconds: float, rate: int = 24_000) -> bytes:
    frames = b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 220 * i / rate))) for i in range(int(seconds * rate))
    )
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(frames)
    return buffer.getvalue()


def test_a_short_clip_is_refused_before_it_is_uploaded(channels_live_server, page, make_user):
    url = channels_live_server.url
    seeded = seed_site(make_user)
    login(page, url, seeded.username)
    page.goto(f"{url}/voices/new/")
    posts: list[str] = []
    page.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)
    page.fill("#id_name", "Too short")
    clip = tone_wav(1.5)
    page.set_input_files("#id_clip", {"name": "short.wav", "mimeType": "audio/wav", "buffer": clip})
    page.set_input_files("#id_consent", {"name": "consent.wav", "mimeType": "audio/wav", "buffer": tone_wav(4)})
    page.click("#create-voice")
    expect(page.locator("#upload-errors")).to_contain_text("1.5 s long")
    expect(page.locator("#upload-errors")).to_contain_text("at least 3")
    assert posts == [] and not Voice.objects.filter(name="Too short").exists()


def test_a_failed_voice_shows_no_stuck_bar_and_can_be_retried_or_deleted(channels_live_server, page, make_user):
    url = channels_live_server.url
    seeded = seed_site(make_user)
    failed = seeded.failed_voice
    failed.reference_audio.save("clip.wav", ContentFile(tone_wav(1.0)), save=True)
    login(page, url, seeded.username)
    page.goto(f"{url}/voices/{failed.pk}/")
    expect(page.locator("#voice-status")).to_have_text("failed")
    expect(page.locator("#voice-percent")).to_be_hidden()  # not a bar stuck at 29 %
    expect(page.locator("#voice-stage")).to_be_hidden()

    page.click("#retry-voice")  # processed again: the short clip fails again, with the processing's own reason
    expect(page.locator("#voice-status")).to_have_text("failed", timeout=30_000)
    failed.refresh_from_db()
    assert failed.status == Voice.Status.FAILED
    assert failed.failure_reason and failed.failure_reason != "The clip has 1.2 s of speech; at least 3 s is needed."
    expect(page.locator("#voice-reason")).to_have_text(failed.failure_reason)
    expect(page.locator("#voice-percent")).to_be_hidden()

    page.click("#delete-voice")
    page.wait_for_url(f"{url}/voices/")
    assert not Voice.objects.filter(pk=failed.pk).exists()
    expect(page.locator("#voices")).not_to_contain_text("Short clip")


def test_a_ready_voice_says_ready_once_and_can_be_used_in_a_call(channels_live_server, page, make_user):
    url = channels_live_server.url
    seeded = seed_site(make_user)
    other = Voice.objects.create(owner=seeded.voice.owner, name="Second voice", status=Voice.Status.READY)
    Voice.objects.filter(pk=other.pk).update(progress_stage="ready", progress_percent=100)
    login(page, url, seeded.username)
    page.goto(f"{url}/voices/{other.pk}/")
    status_line = page.locator("#voice-status").locator("xpath=..")
    expect(status_line).to_have_text("Status: ready", use_inner_text=True)  # not "Status: ready ready"
    page.get_by_role("link", name="Use in a call").click()
    page.wait_for_function("() => window.parley && window.parley.state === 'idle'")
    expect(page.locator("#voice")).to_have_value(str(other.pk))  # not the persona's default voice
