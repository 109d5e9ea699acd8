"""axe-core (npm, pinned in package-lock.json; `make test` installs it into node_modules/) run inside a page.

The source is evaluated through the DevTools protocol, which the pages' Content-Security-Policy does not
govern, so the pages keep their policy while they are checked.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

AXE_JS = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"
GRAVE = ("serious", "critical")


@cache
def _axe_source() -> str:
    if not AXE_JS.exists():
        pytest.fail(f"{AXE_JS} is missing: run `scripts/install-system.sh test` (npm ci installs axe-core)")
    return AXE_JS.read_text()


def grave_violations(page: Page) -> list[dict[str, Any]]:
    """The serious and critical axe violations on the page as it is now: rule id, impact, the first nodes."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(_axe_source())
    result = page.evaluate("async () => await window.axe.run(document, {resultTypes: ['violations']})")
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "help": v["help"],
            "nodes": [(n["target"], n.get("failureSummary", "")[:200]) for n in v["nodes"][:3]],
        }
        for v in result["violations"]
        if v["impact"] in GRAVE
    ]
