"""A web process's own admission (``webapp.common.loop_load``): new calls are refused while its event loop runs
late, so the calls it already carries keep their frames.

The lateness is measured on a real event loop held up for a known time; the rule over it (the limit, its
hysteresis, the one-a-second admissions near it) on given lateness; the refusal end to end through a real daphne
and a real WebSocket client, with the reason on ``/ops/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import override_settings
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.live_server import live_server_env, run_live_server
from webapp.accounts.models import ApiKey
from webapp.accounts.services import apikey_create
from webapp.common.loop_load import CAUTIOUS_ADMIT_S, PROBE_PERIOD_S, LoopLoad
from webapp.conversations.close_codes import CloseCode


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_held_up_loop_is_measured_late_and_turns_calls_away_until_it_keeps_time():
    load = LoopLoad(40.0, window=4)
    load.watch(asyncio.get_running_loop())
    # the loop runs nothing else for 250 ms: the probe due 50 ms in waits about 200 ms
    time.sleep(0.25)  # noqa: ASYNC251 - holding the loop up is the point
    await asyncio.sleep(PROBE_PERIOD_S * 2.5)
    assert max(load.late_ms) >= 250 - PROBE_PERIOD_S * 1000
    assert load.busy and not load.admits() and load.refused == 1
    await asyncio.sleep(PROBE_PERIOD_S * 8)  # the window holds only probes on time again
    assert not load.busy and load.admits()


def test_the_limit_its_hysteresis_and_one_admission_a_second_near_it():
    clock = Clock()
    load = LoopLoad(40.0, window=10, clock=clock)
    for _ in range(10):
        load.observe(5.0)
    assert load.admits() and load.admits()  # well under the limit: no pacing
    for _ in range(10):
        load.observe(45.0)
    assert load.busy and not load.admits()
    assert "45 ms late against a limit of 40 ms" in load.refusal_message()
    for _ in range(10):
        load.observe(25.0)  # under the limit, over half of it: still busy (the calls it would admit push back)
    assert load.busy and not load.admits()
    for _ in range(10):
        load.observe(20.0)  # half the limit: no longer busy
    assert not load.busy and load.admits() and load.admits()
    for _ in range(10):
        load.observe(25.0)  # past half the limit, under three quarters: no pacing
    clock.now += CAUTIOUS_ADMIT_S
    assert load.admits() and load.admits()
    for _ in range(10):
        load.observe(35.0)  # past three quarters of the limit: callers come in one a second
    clock.now += CAUTIOUS_ADMIT_S
    assert not load.busy
    assert load.admits() and not load.admits()
    assert "one new call in a second" in load.refusal_message()
    clock.now += CAUTIOUS_ADMIT_S
    assert load.admits()
    assert load.refused == 3


def test_the_90th_percentile_not_one_late_probe_decides():
    load = LoopLoad(40.0, window=20)
    for late in [5.0] * 18 + [500.0]:
        load.observe(late)
    assert not load.busy  # one stall (a GC pass, a big event) is not a saturated process
    load.observe(500.0)
    assert load.busy


def test_a_limit_of_zero_admits_everything():
    load = LoopLoad(0.0)
    load.observe(10_000.0)
    assert load.admits() and load.refused == 0


def key_for(username: str, *, staff: bool = False) -> str:
    user = get_user_model().objects.create_user(username=username, password="pw-for-tests-only", is_staff=staff)
    if staff:
        user.user_permissions.add(Permission.objects.get(codename="view_console"))
    return apikey_create(user=user, name="loop load")[1]


def events_until_closed(ws) -> list[dict]:
    events = []
    try:
        while True:
            events.append(json.loads(ws.recv(timeout=10)))
    except ConnectionClosed:
        return events


@pytest.mark.django_db(transaction=True)
def test_a_real_daphne_whose_loop_is_late_refuses_the_next_call_with_4013_and_counts_it(django_db_blocker):
    """The limit is set below any real loop's lateness: the first call starts the probe and gets in, the next
    finds the loop "late" and is refused as an overloaded process refuses: before its credential is looked up, so
    its key is never marked used."""
    first, second, watcher = key_for("loop-first"), key_for("loop-second"), key_for("loop-watcher", staff=True)
    url = "/v1/realtime?model=echo"
    with (
        override_settings(PARLEY_WEB_LOOP_LAG_MS=1e-6),
        run_live_server(django_db_blocker, live_server_env("echo")) as server,
    ):
        with connect(server.ws_url + url, additional_headers={"Authorization": f"Bearer {first}"}) as live:
            assert json.loads(live.recv(timeout=10))["type"] == "session.created"
            time.sleep(PROBE_PERIOD_S * 4)
            with connect(server.ws_url + url, additional_headers={"Authorization": f"Bearer {second}"}) as refused:
                events = events_until_closed(refused)
                code = refused.close_code
            offer = urllib.request.Request(  # a WebRTC call is turned away the same way, before its offer is read
                server.url + "/v1/realtime/calls",
                data=b"v=0",
                headers={"Authorization": f"Bearer {second}", "Content-Type": "application/sdp"},
            )
            with pytest.raises(urllib.error.HTTPError) as webrtc:
                urllib.request.urlopen(offer, timeout=10)
        request = urllib.request.Request(server.url + "/ops/metrics", headers={"Authorization": f"Bearer {watcher}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            scrape = response.read().decode()
    assert webrtc.value.code == 503
    assert json.loads(webrtc.value.read())["error"]["code"] == "resource_exhausted"
    assert [e["type"] for e in events] == ["error"]
    error = events[0]["error"]
    assert error["code"] == "resource_exhausted" and "event loop runs" in error["message"]
    assert code == CloseCode.QUEUE_FULL
    assert ApiKey.objects.get(user__username="loop-second").last_used_at is None
    busy = re.search(r'^parley_admissions_refused_total\{reason="web_process_busy"\} (\S+)$', scrape, re.MULTILINE)
    assert busy and float(busy.group(1)) >= 2
    assert re.search(r"^parley_web_loop_late_ms (\S+)$", scrape, re.MULTILINE)
