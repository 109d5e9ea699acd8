"""The staff dashboard of call measures: turn-taking and echo per persona, voice, checkpoint and engine, with
charts over days drawn as inline SVG; staff only."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from django.urls import reverse

from webapp.recordings.echo_leak import echo_of_call
from webapp.recordings.models import Recording

pytestmark = pytest.mark.django_db


def call(user, day: int, *, engine: str, persona: str, latency: float, flagged: bool, leak_db: float | None = None):
    turn_taking = {
        "response_latency_mean_s": latency,
        "overlaps": [{"start": 1.0, "length_s": 0.2, "cut_in": "caller"}] * 2,
        "interruptions": [{"start": 1.0, "yielded": True, "stop_latency_s": 0.3}],
        "interruptions_yielded": 1,
        "talk_ratio": 0.5,
    }
    echo = {"flagged": flagged, "leak_db": leak_db, "delay_ms": 60.0 if flagged else None}
    return Recording.objects.create(
        user=user,
        session_id=f"sess_{engine}_{persona}_{day}_{latency}",
        engine=engine,
        persona_name=persona,
        voice="NATF2",
        checkpoint="/srv/ckpt/tiny-personaplex",
        started_at=datetime(2026, 11, day, 12, tzinfo=UTC),
        duration_s=60.0,
        status="ready",
        turn_taking=turn_taking,
        echo_leak=echo,
    )


@pytest.fixture
def calls(django_user_model):
    user = django_user_model.objects.create_user(username="caller", password="x")
    call(user, 1, engine="personaplex", persona="Tutor", latency=0.4, flagged=False)
    call(user, 1, engine="personaplex", persona="Tutor", latency=0.6, flagged=True, leak_db=-20.0)
    call(user, 2, engine="personaplex", persona="Clerk", latency=0.8, flagged=False)
    call(user, 2, engine="echo", persona="Clerk", latency=0.24, flagged=False)
    Recording.objects.create(  # failed measures count as calls and in no mean
        user=user, session_id="sess_failed", engine="echo", started_at=datetime(2026, 11, 2, tzinfo=UTC),
        turn_taking={"error": "ValueError: x"}, echo_leak={"error": "ValueError: y"},
    )  # fmt: skip


def page(client, **query) -> str:
    response = client.get(reverse("operations:measures"), query)
    assert response.status_code == 200
    return response.content.decode()


def test_staff_see_the_measures_per_engine_with_charts_over_days(client, calls, django_user_model):
    staff = django_user_model.objects.create_user(username="staff", password="x", is_staff=True)
    client.force_login(staff)
    body = page(client)
    rows = dict(re.findall(r'<tr data-group="([^"]+)">(.*?)</tr>', body, re.S))
    assert set(rows) == {"personaplex", "echo"}
    assert '<td class="calls">3</td>' in rows["personaplex"] and "0.60 s" in rows["personaplex"]  # (.4+.6+.8)/3
    assert '<td class="echo">1 (33 %)</td>' in rows["personaplex"] and "-20.0 dB" in rows["personaplex"]
    assert '<td class="calls">2</td>' in rows["echo"] and "0.24 s" in rows["echo"]
    assert body.count("<svg") == 3 and 'id="chart-latency_s"' in body and 'id="chart-echo_share"' in body
    latency_chart = body.split('id="chart-latency_s"')[1].split("</svg>")[0]
    assert latency_chart.count("<polyline") == 2  # one line per engine
    assert "personaplex 2026-11-01: 0.5 s" in latency_chart and "personaplex 2026-11-02: 0.8 s" in latency_chart
    assert "<script" not in body.split("<main")[-1] and " style=" not in latency_chart  # nothing the CSP forbids


@pytest.mark.parametrize(("by", "groups"), [("persona", {"Tutor", "Clerk", "(none)"}), ("voice", {"NATF2", "(none)"}),
                                             ("checkpoint", {"tiny-personaplex", "(none)"})])  # fmt: skip
def test_the_same_measures_per_persona_voice_and_checkpoint(client, calls, django_user_model, by, groups):
    client.force_login(django_user_model.objects.create_user(username="staff", password="x", is_staff=True))
    assert set(re.findall(r'<tr data-group="([^"]+)">', page(client, by=by))) == groups


def test_only_staff_see_the_dashboard(client, calls, django_user_model):
    url = reverse("operations:measures")
    assert client.get(url).status_code == 302  # to the login page
    client.force_login(django_user_model.objects.create_user(username="someone", password="x"))
    assert client.get(url).status_code == 403


def test_an_unknown_grouping_falls_back_to_the_engine(client, calls, django_user_model):
    client.force_login(django_user_model.objects.create_user(username="staff", password="x", is_staff=True))
    assert '<tr data-group="personaplex">' in page(client, by="<script>")


def test_a_calls_echo_is_the_consensus_of_its_live_windows():
    windows = [{"k": "echo", "t": t, "flagged": f, "leak_db": d, "delay_ms": ms, "peak_sigmas": 14.0}
               for t, f, d, ms in [(5, True, -19.0, 60.0), (10, True, -21.0, 59.8), (15, False, None, None)]]  # fmt: skip
    echo = echo_of_call([{"k": "ack"}, *windows], None, None, 24000)
    assert echo["source"] == "live" and echo["flagged"] and echo["flagged_windows"] == 2
    assert echo["leak_db"] == -20.0 and echo["delay_ms"] == 59.9 and len(echo["windows"]) == 3
    one_in_five = [{**windows[0]}] + [{**windows[2], "t": t} for t in (20, 25, 30, 35)]
    assert not echo_of_call(one_in_five, None, None, 24000)["flagged"]  # one chance window among five
