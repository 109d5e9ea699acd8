"""axe-core on every page, light and dark (prefers-color-scheme): no serious or critical violation.

axe-core comes from npm (package.json, pinned by package-lock.json; `make test` runs npm ci) and is injected by
the test (tests/browser/axe.py). Each page is checked as it loads, with its rows (tests/browser/site_pages.py).
"""

from __future__ import annotations

import pytest

from tests.browser.axe import grave_violations
from tests.browser.pages import login
from tests.browser.site_pages import ANONYMOUS_PAGES, seed_site, site_pages

pytestmark = pytest.mark.browser


# Relative luminance (0 black .. 1 white) of the page's background and text colours.
LUMINANCE_JS = """() => {
  const lum = (css) => {
    const [r, g, b] = css.match(/[\\d.]+/g).slice(0, 3).map((v) => Number(v) / 255)
      .map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const style = getComputedStyle(document.body);
  return { background: lum(style.backgroundColor), text: lum(style.color) };
}"""


def violations_on(page, url: str, path: str) -> list[str]:
    page.goto(f"{url}{path}")
    page.wait_for_load_state("networkidle")
    return [f"{path}: {v['impact']} {v['id']} ({v['help']}): {v['nodes']}" for v in grave_violations(page)]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_no_serious_accessibility_violation_on_any_page(
    channels_live_server, browser, make_user, scheme, screenshot_dir
):
    url = channels_live_server.url
    seeded = seed_site(make_user)
    context = browser.new_context(color_scheme=scheme, viewport={"width": 1366, "height": 768})
    page = context.new_page()
    found = []
    for path in ANONYMOUS_PAGES:
        found += violations_on(page, url, path)
    login(page, url, seeded.username)
    for path in site_pages(seeded):
        found += violations_on(page, url, path)
        if scheme == "dark":  # the site follows the system's dark mode: a dark page, light text
            shade = page.evaluate(LUMINANCE_JS)
            if not (shade["background"] < 0.2 and shade["text"] > 0.6):
                found.append(f"{path}: not dark in dark mode: {shade}")
            if screenshot_dir:
                name = path.strip("/").split("?")[0].replace("/", "-") or "call"
                page.screenshot(path=str(screenshot_dir / f"dark-{name}.png"), full_page=True)
    context.close()
    assert not found, "\n".join(found)
