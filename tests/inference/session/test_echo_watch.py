"""The live echo watch: what the caller heard, lined up with their microphone by the playback acks, measured
over short windows. A call is simulated at its real positions: the agent's audio is sent in 80 ms chunks,
reaches the speaker after a jitter buffer and network delay that the server does not know (only the acks
say it), and a leaky speaker feeds it into the microphone."""

from __future__ import annotations

import numpy as np
import pytest

from inference.session import echo_watch
from inference.session.echo_watch import EchoWatch, _Ring, echo_fields

RATE = 24_000
CHUNK = 1920  # 80 ms


def voice(seconds: float, seed: int) -> np.ndarray:
    """Speech-like noise: 2 Hz syllables of band-limited noise at about -20 dBFS, with gaps."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    noise = np.convolve(rng.normal(0, 0.1, len(t)), np.ones(6) / 6, mode="same") * 2.4
    return noise * np.clip(np.sin(2 * np.pi * 2 * t + seed), 0, None)


def simulate(watch: EchoWatch, *, leak_db: float | None, delay_ms: float, playout_ms: float, seconds: float = 9.0):
    """Feed ``seconds`` of call into ``watch``: the agent's audio is heard ``playout_ms`` after it is sent (in
    the caller's microphone stream), the microphone holds the caller plus the leak ``delay_ms`` after that."""
    agent = voice(seconds + 1, 1)
    agent_pcm = np.clip(np.round(agent * 32767), -32768, 32767).astype(np.int16)
    n = int(seconds * RATE)
    mic = voice(seconds, 2) * 0.8
    # The speaker plays agent sample k at microphone position k + playout; the microphone hears it delay later.
    offset = int((playout_ms + delay_ms) * RATE / 1000)
    if leak_db is not None:
        mic[offset:] += agent[: n - offset] * 10 ** (leak_db / 20)
    playout = int(playout_ms * RATE / 1000)
    results = []
    for start in range(0, n, CHUNK):
        watch.caller(mic[start : start + CHUNK].astype(np.float32))
        watch.agent(agent_pcm[start : start + CHUNK].tobytes())
        heard_input = start + CHUNK
        if heard_input % 12_000 < CHUNK and heard_input > playout:  # an ack about every 500 ms
            watch.ack(input_samples=heard_input, client_rate=RATE, output_samples=heard_input - playout)
        watch._next_at = 0  # the test drives the clock: a window is due whenever the acks cover one
        if (result := watch.measure_if_due(inline=True)) is not None:
            results.append(result)
    return results


def watch_with_a_window_due() -> EchoWatch:
    """A watch holding 5 s of both streams, acked, with a window due now."""
    watch = EchoWatch(RATE, RATE)
    watch.caller(voice(5.0, 2).astype(np.float32))
    watch.agent((voice(5.0, 1) * 32767).astype(np.int16).tobytes())
    watch.ack(input_samples=RATE, client_rate=RATE, output_samples=0)
    watch.ack(input_samples=RATE * 5, client_rate=RATE, output_samples=RATE * 4)
    watch._next_at = 0
    return watch


@pytest.mark.parametrize("playout_ms", [120.0, 430.0])
def test_a_leak_of_minus_20_db_after_60_ms_is_found_whatever_the_playout_delay(playout_ms):
    results = simulate(EchoWatch(RATE, RATE), leak_db=-20.0, delay_ms=60.0, playout_ms=playout_ms)
    assert results, "a window was measured"
    for result in results:
        assert result["flagged"]
        assert result["leak_db"] == pytest.approx(-20.0, abs=3.0)
        assert result["delay_ms"] == pytest.approx(60.0, abs=10.0)
        assert result["window_s"] == echo_watch.WINDOW_S


def test_without_a_leak_no_window_is_flagged():
    results = simulate(EchoWatch(RATE, RATE), leak_db=None, delay_ms=0.0, playout_ms=200.0)
    assert results and not any(r["flagged"] for r in results)
    assert echo_fields(results[0])["echo_flagged"] == 0.0 and "echo_leak_db" not in echo_fields(results[0])


def test_a_window_with_the_agent_silent_is_no_clean_window_for_the_live_warning():
    from inference.session.echo_watch import QUIET

    assert QUIET["agent_silent"] and echo_fields(QUIET) == {}


def test_windows_do_not_overlap_and_wait_for_the_acks():
    watch = EchoWatch(RATE, RATE)
    watch.caller(np.zeros(RATE * 5, np.float32))
    watch.agent(np.zeros(RATE * 5, np.int16).tobytes())
    watch._next_at = 0
    assert watch.measure_if_due(inline=True) is None  # no ack: nothing lines the tracks up
    watch.ack(input_samples=RATE, client_rate=RATE, output_samples=0)
    watch.ack(input_samples=RATE * 5, client_rate=RATE, output_samples=RATE * 4)
    assert watch.measure_if_due(inline=True) is not None  # the acks cover a window
    watch._next_at = 0
    assert watch.measure_if_due(inline=True) is None  # the same window is not measured twice


def test_acks_out_of_order_are_skipped_and_a_new_connection_starts_over():
    watch = EchoWatch(RATE, RATE)
    watch.ack(input_samples=RATE, client_rate=RATE, output_samples=100)
    watch.ack(input_samples=RATE // 2, client_rate=RATE, output_samples=200)
    watch.ack(input_samples=2 * RATE, client_rate=RATE, output_samples=50)
    assert len(watch._acks) == 1
    watch.attached()
    assert watch._acks == []


def test_a_client_at_another_rate_is_counted_at_the_engine_rate():
    watch = EchoWatch(RATE, RATE)
    watch.ack(input_samples=48_000, client_rate=48_000, output_samples=0)
    assert watch._acks == [(24_000.0, 0.0)]


def test_the_ring_keeps_the_latest_samples_by_position():
    ring = _Ring(10, np.int16)
    ring.append(np.arange(7, dtype=np.int16))
    ring.append(np.arange(7, 14, dtype=np.int16))
    assert ring.read(4, 14).tolist() == list(range(4, 14))
    assert ring.read(3, 5) is None and ring.read(12, 15) is None
    ring.append(np.arange(14, 40, dtype=np.int16))  # more than it holds at once
    assert ring.read(30, 40).tolist() == list(range(30, 40))


def test_off_the_loop_a_window_is_measured_on_the_echo_thread_and_reported_by_a_later_call():
    watch = watch_with_a_window_due()
    assert watch.measure_if_due() is None  # handed to the thread: nothing to report yet
    watch._pending.result(timeout=30)
    result = watch.measure_if_due()
    assert result is not None and not result["flagged"] and result["peak_sigmas"] > 0  # measured, not skipped
    assert watch.windows == 1 and watch.cost_s > 0


def test_the_socket_service_keeps_only_well_formed_instants():
    from inference.transport.wire import heard_pairs

    assert heard_pairs([[1, 2], [3, 4]]) == [(1, 2), (3, 4)]
    assert heard_pairs([[1, -2], [True, 2], ["1", 2], [1, 2, 3], 7, [5, 6]]) == [(5, 6)]
    assert heard_pairs(None) == [] and heard_pairs({"a": 1}) == []


def test_the_period_backs_off_after_three_clean_windows_and_returns_on_an_echo():
    from inference.session.echo_watch import MAX_PERIOD_S, PERIOD_S, QUIET, EchoWatch

    watch = EchoWatch(24000, 24000)
    watch._counted({"flagged": False})
    assert watch.period_s() == PERIOD_S  # the connection's first minute: every 5 s whatever the windows say
    watch = EchoWatch(24000, 24000)
    watch._attached_at -= 60.0  # a minute into the call
    periods = []
    for _ in range(6):
        periods.append(watch.period_s())
        watch._counted({"flagged": False})
    assert periods == [PERIOD_S, PERIOD_S, PERIOD_S, 2 * PERIOD_S, 4 * PERIOD_S, min(8 * PERIOD_S, MAX_PERIOD_S)]
    assert watch.period_s() == MAX_PERIOD_S
    watch._counted({"flagged": True})  # an echo: measured every 5 s again, so echo_gone follows promptly
    assert watch.period_s() == PERIOD_S
    for _ in range(5):
        watch._counted(QUIET)  # the agent silent: nothing learnt, the period stays
    assert watch.period_s() == PERIOD_S


def test_the_process_budget_admits_windows_until_its_share_of_a_core_is_spent_then_again_as_it_ages():
    now = [100.0]
    budget = echo_watch.EchoBudget(0.1, span_s=10.0, clock=lambda: now[0])
    assert budget.admits()
    budget.spend(0.6)
    assert budget.admits() and not budget.limited  # 0.06 core over the last 10 s
    budget.spend(0.4)
    assert not budget.admits() and budget.limited  # 0.1 core: spent
    now[0] += 10.5  # both windows are older than the span
    assert budget.admits() and not budget.limited
    assert not echo_watch.EchoBudget(0.0).admits()  # 0 turns the watch off


def test_a_due_window_waits_while_the_budget_is_spent_and_is_counted(monkeypatch):
    spent = echo_watch.EchoBudget(0.1, span_s=10.0)
    spent.spend(5.0)
    monkeypatch.setattr(echo_watch, "budget", lambda: spent)
    watch = watch_with_a_window_due()
    assert watch.measure_if_due() is None and watch._pending is None  # nothing handed to the echo thread
    assert watch.deferred == 1 and watch.windows == 0
    assert watch._next_at > 0  # put off by a period, not retried on every housekeeping pass
    fresh = echo_watch.EchoBudget(0.1, span_s=10.0)
    monkeypatch.setattr(echo_watch, "budget", lambda: fresh)
    watch._next_at = 0
    assert watch.measure_if_due() is None
    watch._pending.result(timeout=30)
    assert watch.measure_if_due() is not None and watch.windows == 1
    assert fresh._spent and fresh._spent[0][1] > 0  # the window's CPU was charged to the budget
