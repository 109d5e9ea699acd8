"""The operations console in a real browser: a staff user watches a call live and ends it; others get 403."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis
from playwright.sync_api import expect

from inference.cluster import signed_records
from inference.cluster.registry import SERVICES_KEY
from inference.status import ServiceStatus, SessionStatus, status_to_dict
from tests.browser.pages import hooks, login, open_call_page, start_call, wait_for, wait_for_state

pytestmark = pytest.mark.browser

CONSOLE_PERMS = ("view_console", "end_session")
REGISTRY_SECRET = "console-test-registry-secret"  # the live server reads only records signed with it


def frames_in(row) -> int:
    return int(row.locator("td[data-col=frames_in]").inner_text())


def test_staff_watches_a_call_live_and_ends_it(channels_live_server, browser, make_user, screenshot_dir):
    url = channels_live_server.url
    make_user("console_caller")
    make_user("console_admin", staff=True, perms=CONSOLE_PERMS)
    staff, caller = browser.new_context(), browser.new_context()
    ops, call = staff.new_page(), caller.new_page()
    login(ops, url, "console_admin")
    ops.goto(f"{url}/ops/console/")
    expect(ops.locator("#live-state")).to_have_text("live")
    expect(ops.locator(".service h3")).to_have_text(["in-process"])
    # calls held against the capacity the engine reports (the echo engine admits its slots), drawn as a meter
    held = ops.locator(".service .held-text")
    expect(held).to_contain_text("calls held 0 / 2")
    expect(ops.locator(".service meter.held-meter")).to_have_attribute("max", "2")

    login(call, url, "console_caller")
    open_call_page(call, url)
    session_id = start_call(call)
    wait_for(call, "p.audioChunksReceived > 5")

    row = ops.locator(f'tr[data-session-id="{session_id}"]')
    expect(row).to_be_visible(timeout=5000)  # pushed over /ops/live, no reload
    expect(row.locator("td[data-col=username]")).to_have_text("console_caller")
    expect(row.locator("td[data-col=state]")).to_have_text("active")
    expect(row.locator("td[data-col=engine]")).to_have_text("echo")
    first = frames_in(row)
    expect(held).to_contain_text("calls held 1 / 2")  # the call started: the live console counts it
    expect(ops.locator(".service meter.held-meter")).to_have_js_property("value", 1)
    expect(ops.locator("#host-totals")).to_contain_text(" 1 / 2")
    # The frame counts move while the caller talks: the console is live, not a snapshot.
    ops.wait_for_function(
        "([id, before]) => Number(document.querySelector(`tr[data-session-id='${id}'] td[data-col=frames_in]`)"
        ".textContent) > before + 5",
        arg=[session_id, first],
        timeout=10_000,
    )
    assert int(row.locator("td[data-col=frames_out]").inner_text()) > 0
    # The search box narrows the table; a search for someone else hides the row.
    ops.fill("#filter-text", "nobody-like-this")
    expect(row).to_be_hidden()
    ops.fill("#filter-text", "console_call")
    expect(row).to_be_visible()
    if screenshot_dir:
        ops.screenshot(path=str(screenshot_dir / "console.png"), full_page=True)

    dialogs: list[str] = []

    def confirm(dialog):
        dialogs.append(dialog.message)
        dialog.accept()

    ops.on("dialog", confirm)
    row.get_by_role("button", name="End").click()
    wait_for_state(call, "closed")
    assert dialogs and session_id in dialogs[0]  # the admin confirmed this very session
    assert hooks(call)["closeReason"] == "admin_ended"
    expect(call.locator("#notice")).to_have_text("An administrator ended this call.")
    expect(row).to_have_count(0, timeout=10_000)
    expect(ops.locator("#action-result")).to_contain_text("ended")
    expect(ops.locator("#audit li").first).to_contain_text("console_admin")
    staff.close()
    caller.close()


def test_non_staff_get_403_for_the_console_and_its_socket(channels_live_server, browser, make_user):
    url = channels_live_server.url
    make_user("console_nosy")
    context = browser.new_context()
    page = context.new_page()
    login(page, url, "console_nosy")
    assert page.goto(f"{url}/ops/console/").status == 403
    # The socket handshake is refused: the browser sees a close without ever opening.
    opened = page.evaluate(
        """() => new Promise((resolve) => {
            const ws = new WebSocket(`ws://${location.host}/ops/live`);
            ws.onopen = () => resolve(true);
            ws.onclose = () => resolve(false);
        })"""
    )
    assert opened is False
    csrf = next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")
    refused = page.request.post(
        f"{url}/ops/console/admission/", form={"confirm": "admission", "open": "0"}, headers={"X-CSRFToken": csrf}
    )
    assert refused.status == 403
    context.close()


@pytest.fixture(scope="module")
def registry_live_server(django_db_setup, django_db_blocker, redis_server):
    """A live server whose console reads the Redis registry (no inference service of its own)."""
    from tests.live_server import live_server_env, run_live_server

    env = live_server_env(
        "echo",
        PARLEY_REGISTRY_URL=redis_server.url,
        PARLEY_HEARTBEAT_TIMEOUT_S="5",
        PARLEY_INFERENCE_TOKEN=REGISTRY_SECRET,
    )
    with run_live_server(django_db_blocker, env) as server:
        yield server


def publish_busy_services(redis_url: str, stop: threading.Event) -> None:
    """Two services with 250 sessions each, re-published like heartbeats until ``stop``."""
    client = redis.Redis.from_url(redis_url)
    states = ("active", "paused", "detached", "queued")
    while not stop.is_set():
        for s, service_id in enumerate(("gpu-a", "gpu-b")):
            sessions = tuple(
                SessionStatus(
                    session_id=f"sess_{service_id}_{i:03d}",
                    user_key=f"caller-{s}-{i:03d}",
                    service_id=service_id,
                    engine="echo",
                    state=states[i % 4],
                    duration_s=float(i),
                    frames_in=i * 10,
                    frames_out=i * 9,
                )  # fmt: skip
                for i in range(250)
            )
            status = ServiceStatus(
                service_id=service_id, address=f"tcp://10.0.0.{s + 1}:7700", host=f"gpu{s}", device="cuda",
                engine="echo", checkpoint=None, slots_used=190, slots_total=200, queue_length=60, tick_ms_p50=12.0,
                tick_ms_p99=30.0, gpu_memory={"allocated": 2.5e9}, state="serving", heartbeat_at=time.time(),
                history=tuple((time.time() - 60 + t, 12.0 + t % 5, 30.0 + t % 7, 180 + t % 10) for t in range(60)),
                sessions=sessions,
            )  # fmt: skip
            record = signed_records.sign(status_to_dict(status), REGISTRY_SECRET)
            client.hset(SERVICES_KEY, service_id, json.dumps(record))
        stop.wait(0.5)
    client.delete(SERVICES_KEY)
    client.close()


def test_console_stays_usable_with_500_sessions(registry_live_server, browser, make_user, redis_server):
    url = registry_live_server.url
    make_user("console_big", staff=True, perms=CONSOLE_PERMS)
    stop = threading.Event()
    publisher = threading.Thread(target=publish_busy_services, args=(redis_server.url, stop), daemon=True)
    publisher.start()
    try:
        context = browser.new_context()
        page = context.new_page()
        login(page, url, "console_big")
        page.goto(f"{url}/ops/console/")
        expect(page.locator("#session-count")).to_have_text("500 shown of 500", timeout=10_000)
        expect(page.locator(".service")).to_have_count(2)
        expect(page.locator(".service canvas.tick-spark")).to_have_count(2)
        page.fill("#filter-text", "caller-1-04")  # caller-1-040 .. caller-1-049
        expect(page.locator("#session-count")).to_have_text("10 shown of 500")
        page.select_option("#filter-state", "paused")  # i % 4 == 1 among 40..49: 41, 45, 49
        expect(page.locator("#session-count")).to_have_text("3 shown of 500")
        page.fill("#filter-text", "")
        page.select_option("#filter-service", "gpu-a")
        expect(page.locator("#session-count")).to_have_text("63 shown of 500")  # paused on gpu-a: i = 1, 5, ..., 249
        # Still live after several pushes of the whole 500-row document.
        page.wait_for_timeout(2000)
        expect(page.locator("#live-state")).to_have_text("live")
        expect(page.locator("#queue tbody tr")).to_have_count(124)  # queued: i = 3, 7, ..., 247 on each service
        context.close()
    finally:
        stop.set()
        publisher.join(5)
