"""Acceptance: true mouth-to-ear latency, measured in chromium, stays within the bound.

The fake microphone plays a chirp every 500 ms; the echo engine at zero delay returns each one, so
the delay between a chirp entering the page's audio graph and its copy reaching the destination is
the stack's own latency (capture, framing, the WebSocket both ways, the tick, the jitter buffer, the
output); ``latency_probe`` finds each one by cross-correlation. The goal is p95 <= 200 ms on an idle
loopback; the bound here leaves room for CI's two shared cores. The numbers themselves, over a
60 s call and before/after, are ``bench/latency_browser.py``'s (``bench/results/latency-*.json``).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.latency_probe import (
    MARK_PERIOD_S,
    SWEEPS,
    AudioStalls,
    chirp,
    match_marks,
    run_measured_call,
    write_marked_wav,
)
from tests.browser.pages import login
from tests.live_server import live_server_env, run_live_server

# Its bounds are latency on a machine doing nothing else: it runs alone, after the parallel browser lanes.
pytestmark = pytest.mark.solo

CALL_SECONDS = 30
# The goal is 200 ms on an idle loopback. On this 2-core machine at load ~1.2 a call measured p95 209-234 ms
# (bench/notes/latency.md); CI runs chromium, daphne, the service and pytest on two cores: +100 ms for that.
P95_BOUND_MS = 300
UNDERRUNS_BOUND = 6  # in a 30 s call: one every 5 s at most
MEASURED_AGREES_MS = 30  # the page's own figure vs the chirps: same quantity, different sampling


@pytest.fixture(scope="module")
def zero_delay_echo_server(django_db_setup, django_db_blocker):
    with run_live_server(django_db_blocker, live_server_env("echo", PARLEY_ECHO_DELAY_FRAMES="0")) as server:
        yield server


@pytest.fixture(scope="module")
def marked_mic_browser(launch_with_fake_mic, tmp_path_factory):
    """A chromium of its own whose fake microphone plays the chirps (the suite's plays speech)."""
    return launch_with_fake_mic(write_marked_wav(tmp_path_factory.mktemp("marks") / "marks.wav"))


def tapped_call_page(url: str, browser, make_user, username: str):
    """A signed-in call page with its output tapped (``tap=1``), idle and ready to start."""
    make_user(username)
    page = browser.new_page()
    login(page, url, username)
    page.goto(f"{url}/?raw=1&tap=1&transport=websocket")
    page.wait_for_function("() => window.parley && window.parley.state === 'idle'")
    return page


@pytest.mark.browser
def test_echo_mouth_to_ear_p95_is_within_the_bound(zero_delay_echo_server, marked_mic_browser, make_user):
    page = tapped_call_page(zero_delay_echo_server.url, marked_mic_browser, make_user, "latency")

    call = run_measured_call(page, CALL_SECONDS)
    marks = call.marks()

    expected = CALL_SECONDS / MARK_PERIOD_S
    assert marks.found >= 0.85 * expected, f"only {marks.found} of ~{expected:.0f} chirps came back"
    assert marks.missing <= 2
    summary = marks.summary()
    print(f"mouth-to-ear over {CALL_SECONDS} s: {summary}, page: underruns {call.final['underruns']}")
    assert marks.percentile(95) <= P95_BOUND_MS, summary
    # Zero is the goal on an idle loopback. Rare, not zero, on two shared cores: one machine of this kind had 2
    # in 30 s at load 5; another (2026-12-02) 4 in 30 s and 7 in 60 s at load ~1, where the page's pieces reached
    # the server's tick late now and then (its input underruns). A broken jitter buffer underruns every second.
    assert call.final["underruns"] <= UNDERRUNS_BOUND
    assert call.final["errors"] == []
    # The page's audio travels as binary frames both ways (base64 JSON is for stock clients): every piece
    # up, and everything down once the server has applied the page's session.update.
    wire = call.wire.summary()
    assert wire["up"]["audio_messages"] > 0 and wire["up"]["binary_audio_messages"] == wire["up"]["audio_messages"]
    assert wire["down"]["binary_audio_messages"] >= wire["down"]["audio_messages"] - 2, wire
    assert wire["up"]["payload_bytes_per_audio_s"] < 1.05 * 48_000  # pcm16 at 24 kHz plus one kind byte a piece
    # The page's own measured figure (what its latency chart shows) is the same quantity.
    shown = [s["measuredMs"] for s in call.samples if s["measuredMs"]]
    assert len(shown) >= CALL_SECONDS // 2
    assert abs(float(np.median(shown)) - marks.percentile(50)) <= MEASURED_AGREES_MS
    # ... and the time from Start to the first agent audio is measured and shown.
    assert 0 < call.final["firstAudioMs"] < 5000
    assert page.locator("[data-figure=first_audio]").text_content().endswith(" ms")
    # where that time went, step by step, on the figure itself (its title) and in the hooks
    timeline = call.final["startTimeline"]
    assert timeline["microphone"] <= timeline["session_created"] <= timeline["first_chunk_received"]
    assert timeline["first_chunk_received"] <= timeline["first_sound"]
    detail = page.locator("[data-figure=first_audio]").get_attribute("title")
    assert "session created" in detail and f"heard {timeline['first_sound']} ms" in detail


@pytest.mark.browser
def test_a_stalled_audio_thread_does_not_add_its_stall_to_the_delay(
    zero_delay_echo_server, marked_mic_browser, make_user
):
    """Chromium's audio service stopped 150 ms every 5 s: the page's audio clock loses that time, the
    microphone's audio of it never reaches the server (which pads it), and the server's audio sent
    meanwhile would queue on the stalled clock, 150 ms more delay per stall (measured without the drop:
    p50 290-363 ms over 60 s). The jitter buffer drops what arrived for the lost time, so the bound holds."""
    page = tapped_call_page(zero_delay_echo_server.url, marked_mic_browser, make_user, "stalls")

    with AudioStalls(ms=150, every_s=5) as stalls:
        call = run_measured_call(page, CALL_SECONDS)
    marks = call.marks()
    summary = marks.summary()
    print(
        f"mouth-to-ear over {CALL_SECONDS} s with {len(stalls.times)} audio stalls: {summary}, page: {call.final['jitter']}"
    )
    assert len(stalls.times) >= 4
    assert call.final["jitter"]["slipDroppedMs"] >= 150  # at least one stall's worth was dropped ...
    assert marks.found >= 0.7 * CALL_SECONDS / MARK_PERIOD_S  # (the stalls themselves lose some chirps)
    assert marks.percentile(95) <= P95_BOUND_MS, summary  # ... and the delay did not keep it
    assert call.final["errors"] == []


def test_marks_are_matched_beyond_one_period_and_lost_ones_are_counted():
    """The probe itself, on synthetic signals: a 1.23 s delay (longer than the spacing of two marks) is
    measured as such, not as the 0.23 s alias; marks that never come back are counted, not matched."""
    rate = 44_100
    mic = np.zeros(12 * rate)
    for i in range(22):
        sweep = chirp(rate, i % len(SWEEPS)) * 0.5
        start = int(i * MARK_PERIOD_S * rate)
        mic[start : start + len(sweep)] += sweep
    delay = int(1.23 * rate)
    out = np.zeros_like(mic)
    out[delay:] = 0.8 * mic[:-delay]
    out[6 * rate : 7 * rate] = 0  # two marks lost on the way
    marks = match_marks(mic, out, rate, output_latency_s=0.01)
    assert marks.missing == 2
    assert marks.found >= 16
    assert marks.percentile(5) == pytest.approx(1240, abs=1) and marks.percentile(95) == pytest.approx(1240, abs=1)
