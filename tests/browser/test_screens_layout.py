"""Every page at a phone's size (390x844) and a laptop's (1366x768): no sideways scrolling, every control
reachable (inside the viewport, or inside a box that scrolls sideways itself), the navigation readable.
The console's sessions table fits a 1366 px screen with its End button in view.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.pages import login, open_call_page, start_call, wait_for
from tests.browser.site_pages import ANONYMOUS_PAGES, LONG_INSTRUCTIONS, seed_site, site_pages

pytestmark = pytest.mark.browser

VIEWPORTS = {"phone": {"width": 390, "height": 844}, "laptop": {"width": 1366, "height": 768}}

# Controls whose box lies outside the viewport and not inside a box that scrolls sideways: unreachable.
UNREACHABLE_JS = """() => {
  const width = document.documentElement.clientWidth;
  const scrollsSideways = (el) => {
    for (let box = el.parentElement; box && box !== document.body; box = box.parentElement) {
      const style = getComputedStyle(box);
      if (["auto", "scroll"].includes(style.overflowX) && box.scrollWidth > box.clientWidth) return true;
    }
    return false;
  };
  const controls = document.querySelectorAll("a[href], button, input:not([type=hidden]), select, textarea, summary");
  return [...controls]
    .filter((el) => el.getClientRects().length && getComputedStyle(el).visibility !== "hidden")
    .filter((el) => { const r = el.getBoundingClientRect(); return r.left < -1 || r.right > width + 1; })
    .filter((el) => !scrollsSideways(el))
    .map((el) => `${el.tagName.toLowerCase()}#${el.id || ""} "${(el.textContent || el.name || "").trim().slice(0, 30)}"`);
}"""

# The page is wider than the viewport: the browser would scroll sideways (or zoom out on a phone).
OVERFLOW_JS = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"


def check_page(page, url: str, path: str) -> list[str]:
    page.goto(f"{url}{path}")
    page.wait_for_load_state("networkidle")
    problems = []
    overflow = page.evaluate(OVERFLOW_JS)
    if overflow > 0:
        problems.append(f"{path}: {overflow} px wider than the viewport")
    unreachable = page.evaluate(UNREACHABLE_JS)
    if unreachable:
        problems.append(f"{path}: controls outside the viewport: {unreachable}")
    return problems


@pytest.mark.parametrize("size", VIEWPORTS)
def test_every_page_fits_the_screen_with_every_control_reachable(
    channels_live_server, browser, make_user, size, screenshot_dir
):
    url = channels_live_server.url
    seeded = seed_site(make_user)
    context = browser.new_context(viewport=VIEWPORTS[size])
    page = context.new_page()
    problems = []
    for path in ANONYMOUS_PAGES:
        problems += check_page(page, url, path)
    login(page, url, seeded.username)
    for path in site_pages(seeded):
        problems += check_page(page, url, path)
        if screenshot_dir:
            name = path.strip("/").split("?")[0].replace("/", "-") or "call"
            page.screenshot(path=str(screenshot_dir / f"{size}-{name}.png"), full_page=True)
    context.close()
    assert not problems, "\n".join(problems)


def test_the_navigation_is_readable_on_a_phone(channels_live_server, browser, make_user):
    """Nav links wrap inside the dark bar, so none lies as white text on the light page below it."""
    url = channels_live_server.url
    seeded = seed_site(make_user)
    page = browser.new_context(viewport=VIEWPORTS["phone"]).new_page()
    login(page, url, seeded.username)
    nav = page.locator("nav.site-nav")
    box = nav.bounding_box()
    links = nav.locator("a, button")
    assert links.count() >= 8
    for i in range(links.count()):
        link = links.nth(i)
        if not link.is_visible():
            continue
        r = link.bounding_box()
        assert box["y"] <= r["y"] and r["y"] + r["height"] <= box["y"] + box["height"] + 1, link.inner_text()
        assert 0 <= r["x"] and r["x"] + r["width"] <= 390, link.inner_text()
    expect(nav.get_by_role("link", name="Console")).to_be_visible()  # staff reach the console from the nav


def test_the_console_fits_a_laptop_with_end_in_view(channels_live_server, browser, make_user, screenshot_dir):
    url = channels_live_server.url
    seeded = seed_site(make_user)
    caller = browser.new_context().new_page()
    login(caller, url, seeded.username)
    open_call_page(caller, url)
    caller.fill("#persona", LONG_INSTRUCTIONS)
    start_call(caller)
    wait_for(caller, "p.audioChunksReceived > 2")

    ops = browser.new_context(viewport=VIEWPORTS["laptop"]).new_page()
    login(ops, url, seeded.username)
    ops.goto(f"{url}/ops/console/")
    row = ops.locator("#sessions tbody tr").first
    expect(row).to_be_visible(timeout=10_000)
    end = row.get_by_role("button", name="End")
    box = end.bounding_box()
    assert box["x"] + box["width"] <= 1366, f"End lies at x={box['x']:.0f}..{box['x'] + box['width']:.0f}"
    assert ops.evaluate(OVERFLOW_JS) <= 0
    wrap = ops.locator(".table-wrap")
    assert wrap.evaluate("(el) => el.scrollWidth <= el.clientWidth + 1"), "the sessions table scrolls sideways"
    persona = row.locator("td[data-col=persona]")
    # one line cut short (its text is wider than the cell), not the whole instructions
    assert persona.evaluate("(el) => getComputedStyle(el).whiteSpace === 'nowrap' && el.scrollWidth > el.clientWidth")
    assert (persona.get_attribute("title") or "").startswith("You are a patient guide")  # the text on hover
    service_text = ops.locator("#services").inner_text()
    assert "GPU memory" not in service_text  # the echo service runs on the CPU
    if screenshot_dir:
        ops.screenshot(path=str(screenshot_dir / "laptop-console-live.png"), full_page=True)
    caller.click("#stop")
