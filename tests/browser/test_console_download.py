"""The console shows a checkpoint being fetched from the hub: a daphne live server whose ``PARLEY_CHECKPOINT`` is
a hub id warms up as it starts, fetching the tiny PersonaPlex checkpoint from a hub endpoint on loopback
(``HF_ENDPOINT``); the hub holds the weights after 12 MiB until the console has shown the fetch under
way (byte count, progress bar part-filled), then the console says done."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.pages import PASSWORD
from tests.inference.checkpoints.local_hub import LocalHub
from tests.live_server import live_server_env, run_live_server

pytestmark = pytest.mark.browser

REPO = "nvidia/personaplex-7b-v1"
TINY = Path(__file__).resolve().parents[1] / "data" / "personaplex" / "ckpt"


@pytest.fixture
def hub_live_server(tmp_path, django_db_setup, django_db_blocker, settings):
    settings.PARLEY_WARM_START = "auto"  # the forked server starts building its service (and fetching) at once
    assert "webapp.asgi" not in sys.modules, "the server must import webapp.asgi itself, after the fork"
    with LocalHub({REPO: TINY}, hold=threading.Event()) as hub:
        env = live_server_env("echo", REPO, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hub"),
                              HF_HUB_OFFLINE="0", HF_TOKEN="")  # fmt: skip
        with run_live_server(django_db_blocker, env) as server:
            try:
                yield server, hub
            finally:
                hub.hold.set()


def test_the_console_shows_a_hub_download_while_it_runs(hub_live_server, browser, make_user):
    server, hub = hub_live_server
    make_user("download_admin", staff=True, perms=("view_console",))
    page = browser.new_context().new_page()
    # straight to the console: the call page waits for the engine the download is for
    page.goto(f"{server.url}/accounts/login/?next=/ops/console/")
    page.fill("input[name=username]", "download_admin")
    page.fill("input[name=password]", PASSWORD)
    page.click("form [type=submit]")
    page.wait_for_url(lambda url: "/ops/console/" in url)
    item = page.locator(f'#downloads li[data-repo="{REPO}"]')
    # the server imports the engine's modules before it fetches: allow for a loaded machine
    expect(item).to_have_attribute("data-state", "downloading", timeout=120_000)
    # bytes under way against the whole, the bar part-filled: pushed over the live socket, no reload
    page.wait_for_function(
        """repo => {
          const bar = document.querySelector(`#downloads li[data-repo="${repo}"] progress`);
          return bar && bar.value > 10 * 2 ** 20 && bar.value < bar.max;
        }""",
        arg=REPO,
        timeout=60_000,
    )
    expect(item).to_contain_text("MiB")
    hub.hold.set()  # the rest of the weights
    expect(item).to_have_attribute("data-state", "done", timeout=60_000)
    expect(item).to_contain_text("5 / 5 files")
    assert any(r.endswith("/model.safetensors") and r.startswith("GET") for r in hub.requests)
