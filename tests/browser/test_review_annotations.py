"""Acceptance: a recorded call reviewed in the browser, at a phone's width, from the keyboard where it counts.

The owner labels two spans on the review timeline (one dragged across the span track, one typed with the
playhead button and the keyboard), rates the call and tags it; the list finds the call by its label; a
reviewer cannot open it until the owner shares it with them, then sees the owner's spans.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.axe import grave_violations
from tests.browser.pages import login, open_call_page, start_call, wait_for, wait_for_state
from tests.browser.test_screens_layout import OVERFLOW_JS, UNREACHABLE_JS, VIEWPORTS
from tests.live_server import live_server_env, run_live_server
from tests.webapp.recordings.conftest import seed_review_set
from tests.webapp.recordings.test_wall_clock_live import processed
from webapp.recordings import sharing
from webapp.recordings.models import Annotation, Rating, Recording, RecordingTag

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def review_server(django_db_setup, django_db_blocker, tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw-recordings")
    with run_live_server(django_db_blocker, live_server_env("echo", PARLEY_RECORDINGS_DIR=str(raw))) as server:
        yield server


SLOW_MACHINE_MS = 90_000  # page loads on a loaded CI machine; nothing here measures time


def new_page(browser, viewport: str, **options):
    page = browser.new_context(viewport=VIEWPORTS[viewport], **options).new_page()
    page.set_default_timeout(SLOW_MACHINE_MS)
    return page


def review_ready(page) -> None:
    page.wait_for_function("() => window.review && window.review.state === 'ready'", timeout=SLOW_MACHINE_MS)


def fits_the_screen(page) -> None:
    assert page.evaluate(OVERFLOW_JS) <= 0, "wider than the phone"
    assert page.evaluate(UNREACHABLE_JS) == []
    assert grave_violations(page) == []


def test_annotate_rate_tag_find_by_label_and_share_with_a_reviewer(review_server, browser, make_user, screenshot_dir):
    url = review_server.url
    seed_review_set()
    owner = make_user("annotating-owner")
    reviewer = make_user("second-reviewer")
    reviewer.groups.add(sharing.reviewers_group())
    caller = new_page(browser, "laptop")
    login(caller, url, "annotating-owner")
    open_call_page(caller, url)
    session_id = start_call(caller)
    wait_for(caller, "p.playedMs > 4000")
    caller.click("#stop")
    wait_for_state(caller, "closed")
    recording, _ = processed(session_id)
    assert recording.user_id == owner.pk
    caller.context.close()
    detail = f"{url}/recordings/{recording.pk}/"

    # The reviewer cannot see the call before it is shared.
    theirs = new_page(browser, "laptop")
    login(theirs, url, "second-reviewer")
    assert theirs.goto(detail).status == 404
    theirs.goto(f"{url}/recordings/")
    expect(theirs.locator(f'tr[data-recording="{recording.pk}"]')).to_have_count(0)

    page = new_page(browser, "phone", has_touch=True)
    login(page, url, "annotating-owner")
    page.goto(detail)
    review_ready(page)
    fits_the_screen(page)

    # Span 1: dragged across the span track, from 10 % to 40 % of the call.
    track = page.locator("#span-track")
    track.scroll_into_view_if_needed()
    box = track.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + 0.1 * box["width"], y)
    page.mouse.down()
    page.mouse.move(box["x"] + 0.25 * box["width"], y, steps=5)
    page.mouse.move(box["x"] + 0.4 * box["width"], y, steps=5)
    page.mouse.up()
    expect(page.locator("#span-label")).to_be_focused()  # the drag hands over to the label picker
    duration = recording.duration_s
    start, end = float(page.input_value("#span-start")), float(page.input_value("#span-end"))
    assert abs(start - 0.1 * duration) < 0.15 and abs(end - 0.4 * duration) < 0.15, (start, end, duration)
    page.select_option("#span-label", label="talked over the caller")
    page.fill("#span-note", "cut in on the greeting")
    page.click("#add-annotation")
    expect(page.locator("#annotations li[data-annotation]")).to_have_count(1)

    # Span 2 from the keyboard alone: the playhead button (at 0 s), an end typed in, the label picked with keys.
    page.focus("#start-at-playhead")
    page.keyboard.press("Enter")
    assert page.input_value("#span-start") == "0.0"
    page.keyboard.press("Tab")  # to the end field
    expect(page.locator("#span-end")).to_be_focused()
    page.keyboard.type("1.5")
    page.focus("#span-label")
    page.keyboard.type("echo")  # a select picks the option its typed name begins
    assert page.locator("#span-label option:checked").inner_text() == "echo"
    page.focus("#span-note")
    page.keyboard.press("Enter")  # submits the form
    spans = page.locator("#annotations li[data-annotation]")
    expect(spans).to_have_count(2)
    expect(spans.nth(0)).to_contain_text("echo")
    expect(spans.nth(1)).to_contain_text("talked over the caller")
    page.wait_for_function("() => window.reviewSpans && window.reviewSpans.spans === 2")

    # Rate 4 with the arrow keys, and tag.
    page.focus("#rating-form input[value='1']")
    page.keyboard.press("Space")
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    page.click("#rate")
    expect(page.locator("#rating-summary")).to_contain_text("yours: 4")
    page.fill("#tag-input", "Latency")
    page.keyboard.press("Enter")
    expect(page.locator("#tags li[data-tag='latency']")).to_be_visible()
    review_ready(page)
    fits_the_screen(page)
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "phone-recording-annotated.png"), full_page=True)
    assert sorted(Annotation.objects.filter(recording=recording).values_list("label__name", flat=True)) == [
        "echo", "talked over the caller",
    ]  # fmt: skip
    assert Rating.objects.get(recording=recording).stars == 4
    assert RecordingTag.objects.get(recording=recording).tag.name == "latency"

    # Find the call by its label with the list's filter form; another label leaves it out.
    page.goto(f"{url}/recordings/")
    page.select_option("#id_label", label="echo")
    page.click(".rec-filters button[type=submit]")
    row = page.locator(f'tr[data-recording="{recording.pk}"]')
    expect(row).to_have_count(1)
    expect(row.locator(".rec-review")).to_contain_text("talked over the caller")
    expect(row.locator(".rec-review")).to_contain_text("#latency")
    page.goto(f"{url}/recordings/?label=good")
    expect(page.locator(f'tr[data-recording="{recording.pk}"]')).to_have_count(0)
    page.goto(f"{url}/recordings/?q=greeting")  # the search reads notes too
    expect(page.locator(f'tr[data-recording="{recording.pk}"]')).to_have_count(1)
    fits_the_screen(page)
    if screenshot_dir:
        page.screenshot(path=str(screenshot_dir / "phone-recordings-found-by-note.png"), full_page=True)

    # Share with the named reviewer: now they see it, with the owner's spans, and can find it by label.
    page.goto(detail)
    page.select_option("#share-with", label="reviewer second-reviewer")
    page.click("#share")
    expect(page.locator("#shares")).to_contain_text("reviewer second-reviewer")
    theirs.goto(detail)
    review_ready(theirs)
    expect(theirs.locator("#annotations li[data-annotation]")).to_have_count(2)
    expect(theirs.locator("#share-form")).to_have_count(0)  # a reviewer cannot share it on
    theirs.goto(f"{url}/recordings/?label=talked+over+the+caller")
    expect(theirs.locator(f'tr[data-recording="{recording.pk}"]')).to_have_count(1)
    assert Recording.objects.filter(pk=recording.pk).exists()
