"""Echo leak: the agent's audio fed back into the caller's microphone is found, with its level and delay."""

from __future__ import annotations

import numpy as np
import pytest

from inference.audio.echo_leak import EchoLeakError, measure_echo
from webapp.recordings.echo_leak import echo_of_call

RATE = 24_000


def voice(seconds: float, seed: int) -> np.ndarray:
    """Speech-like noise: 4 Hz syllables of band-limited noise at about -20 dBFS, with gaps."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    noise = np.convolve(rng.normal(0, 0.1, len(t)), np.ones(6) / 6, mode="same") * 2.4
    return noise * np.clip(np.sin(2 * np.pi * 2 * t + seed), 0, None)


def call(leak_db: float | None, delay_ms: float) -> tuple[np.ndarray, np.ndarray]:
    agent = voice(8.0, 1)
    caller = voice(8.0, 2) * 0.8 + np.random.default_rng(3).normal(0, 10 ** (-60 / 20), len(agent))
    if leak_db is not None:
        shift = int(delay_ms * RATE / 1000)
        caller[shift:] += agent[: len(agent) - shift] * 10 ** (leak_db / 20)
    as_int16 = lambda x: np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)  # noqa: E731
    return as_int16(caller), as_int16(agent)


def test_agent_audio_fed_back_at_minus_20_db_after_60_ms_is_flagged_with_its_level_and_delay():
    echo = measure_echo(*call(-20.0, 60.0), RATE)
    assert echo["flagged"]
    assert echo["leak_db"] == pytest.approx(-20.0, abs=3.0)
    assert echo["delay_ms"] == pytest.approx(60.0, abs=10.0)


@pytest.mark.parametrize(("leak_db", "delay_ms"), [(-12.0, 250.0), (-26.0, 20.0)])
def test_other_levels_and_delays_are_measured(leak_db, delay_ms):
    echo = measure_echo(*call(leak_db, delay_ms), RATE)
    assert echo["flagged"]
    assert echo["leak_db"] == pytest.approx(leak_db, abs=3.0) and echo["delay_ms"] == pytest.approx(delay_ms, abs=10.0)


def test_the_same_call_without_the_loop_is_not_flagged():
    echo = measure_echo(*call(None, 0.0), RATE)
    assert not echo["flagged"] and echo["leak_db"] is None


def test_a_silent_agent_or_empty_tracks_are_not_flagged():
    caller, _ = call(None, 0.0)
    assert not measure_echo(caller, np.zeros_like(caller), RATE)["flagged"]
    assert not measure_echo(np.zeros(0, np.int16), np.zeros(0, np.int16), RATE)["flagged"]


def test_a_silent_agent_is_marked_so_and_a_missed_echo_is_not():
    caller, agent = call(None, 0.0)
    assert measure_echo(caller, np.zeros_like(caller), RATE)["agent_silent"]
    assert measure_echo(caller, agent, RATE)["agent_silent"] is False


def live_window(t: float, *, flagged: bool = False, silent: bool = False) -> dict:
    found = {"leak_db": -20.5, "delay_ms": 60.0, "peak_sigmas": 40.0} if flagged else {"leak_db": None, "delay_ms": None}
    return {"k": "echo", "t": t, "flagged": flagged, "peak_sigmas": 0.0 if silent else 5.0, "agent_silent": silent} | found


def test_a_calls_echo_counts_only_the_windows_in_which_the_agent_spoke():
    # 2 of 3 spoken windows flagged; 5 more windows with the agent silent (they said nothing either way).
    windows = [live_window(0, flagged=True), live_window(5, flagged=True), live_window(10)]
    windows += [live_window(15 + 5 * i, silent=True) for i in range(5)]
    echo = echo_of_call(windows, None, None, RATE)
    assert echo["flagged"] and echo["flagged_windows"] == 2
    assert (echo["leak_db"], echo["delay_ms"], echo["source"]) == (-20.5, 60.0, "live")
    # One flagged window among 4 spoken ones is chance, not a leaking speaker.
    chance = [live_window(0, flagged=True)] + [live_window(5 * i) for i in range(1, 4)]
    assert not echo_of_call(chance + windows[3:], None, None, RATE)["flagged"]


def test_windows_recorded_before_they_named_a_silent_agent_are_read_as_such():
    old = [{k: v for k, v in w.items() if k != "agent_silent"} for w in [live_window(0, flagged=True)]]
    old += [{"k": "echo", "t": 5.0 * i, "flagged": False, "leak_db": None, "peak_sigmas": 0.0} for i in range(1, 4)]
    assert echo_of_call(old, None, None, RATE)["flagged"]


def test_bad_tracks_are_a_typed_error():
    with pytest.raises(EchoLeakError):
        measure_echo(np.zeros((4, 2), np.int16), np.zeros(4, np.int16), RATE)
    with pytest.raises(EchoLeakError):
        measure_echo(np.zeros(4, np.int16), np.zeros(4, np.int16), 0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("looped", [True, False], ids=["loop", "headphones"])
def test_post_processing_stores_the_echo_and_the_review_page_flags_it(
    client, recorder, media_dir, make_recording, django_user_model, looped
):
    from django.urls import reverse

    from inference.engines.base import SlotOutput
    from inference.recording.chunks import folder_state
    from inference.recording.recorder import record_steps
    from webapp.recordings import services

    from .conftest import CHUNK, META, wait_for
    from .conftest import RATE as CALL_RATE

    assert CALL_RATE == RATE
    caller, agent = call(-20.0 if looped else None, 60.0)
    owner = django_user_model.objects.create_user(username="owner", password="x")
    recording = make_recording(owner, session_id="sess_echo")
    raw = recorder.begin("sess_echo", META)
    steps = len(agent) // CHUNK
    record_steps([
        raw.step_item(caller[i * CHUNK : (i + 1) * CHUNK].astype(np.float32) / 32768,
                      agent[i * CHUNK : (i + 1) * CHUNK].astype("<i2").tobytes(),
                      SlotOutput(audio=np.zeros(0), text=""), 2.0)
        for i in range(steps)
    ])  # fmt: skip
    raw.finish("client_close")
    wait_for(lambda: folder_state(recorder.root / "sess_echo") == "finished")
    services.recording_close(session_id="sess_echo", reason="client_close")
    recording.refresh_from_db()
    echo = recording.echo_leak
    assert echo["flagged"] is looped
    if looped:
        assert echo["leak_db"] == pytest.approx(-20.0, abs=3.0) and echo["delay_ms"] == pytest.approx(60.0, abs=10.0)
    client.force_login(owner)
    body = client.get(reverse("recording-detail", args=[recording.pk])).content.decode()
    assert ("the agent could hear itself" in body) is looped and 'id="tt-echo"' in body
