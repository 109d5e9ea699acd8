"""bench/serving_e2e.py's unit engine: the service's engine speaks on the capacity bench's units (so its tick is
comparable with bench/results/unit-capacity-*.json), and the callers' units are read as 1 s units.

The end-to-end run itself (daphne, the service process, callers) is a bench: ``bench/serving_e2e.py
--gpu-service unit-tiny``; timings stay there."""

from __future__ import annotations

import numpy as np
import pytest

from bench.serving_analysis import analyse_downlink, analyse_units
from bench.serving_callers import FRAME_S, CallRecord
from bench.unit_workload import DATA, speaks


def test_the_bench_unit_engine_speaks_on_the_capacity_rule_and_counts_units_from_the_prepare(tmp_path):
    pytest.importorskip("torch")
    from bench.serving_unit_engine import build_unit_engine
    from inference.engines.base import SlotConfig, SlotInput

    engine = build_unit_engine(2, tmp_path, tiny=True, vocoder="none")
    audio = np.load(DATA / "audio8" / "user_audio.npy").astype(np.float32)
    engine.open_slot(0, SlotConfig())
    chunk = audio[:16000]
    engine.step({0: SlotInput(audio=chunk)})  # slot 0's prepare: its input is not a unit
    engine.open_slot(1, SlotConfig())
    decisions: dict[int, list[str]] = {0: [], 1: []}
    for u in range(8):
        chunk = audio[(u % 7) * 16000 : (u % 7 + 1) * 16000]
        out = engine.step({0: SlotInput(audio=chunk), 1: SlotInput(audio=chunk)})
        for slot in (0, 1):
            if out[slot].decision is not None:
                decisions[slot].append(out[slot].decision)
    # slot 1 was prepared on the loop's first step, so it decided one unit fewer
    assert decisions[0] == ["speak" if speaks(0, u) else "listen" for u in range(8)]
    assert decisions[1] == ["speak" if speaks(1, u) else "listen" for u in range(7)]
    assert "speak" in decisions[0] and "speak" in decisions[1]  # the rule let both speak


def unit_call(line: int, ticks: np.ndarray, spread_s: float, spoken: int) -> CallRecord:
    """A call of ``len(ticks)`` seconds whose decisions arrive ``spread_s`` after each tick."""
    frames = round(len(ticks) / FRAME_S)
    sent = ticks[0] - 0.5 + np.arange(frames) * FRAME_S
    call = CallRecord(line, len(ticks), sent, np.full(frames, np.nan), session_id=f"s{line}", frames_sent=frames)
    call.period_ms, call.units_spoken = 1000.0, spoken
    call.decisions_at = list(ticks + spread_s)
    call.audio_arrivals = list(ticks[:spoken] + spread_s)
    call.audio_samples_in, call.audio_frames_in = spoken * 24000, spoken
    return call


def test_units_are_read_against_the_one_second_tick():
    ticks = 1000.25 + np.arange(30.0)  # 30 one-second units on one grid
    calls = [unit_call(i, ticks, spread_s=0.002 * i, spoken=12) for i in range(10)]
    units = analyse_units(calls)
    assert units["units_decided"] == 300 and units["units_spoken"] == 120
    assert units["speaking_fraction"] == pytest.approx(0.4)
    # the earliest call's decisions mark the tick; the others come 2 ms apart after it
    assert units["decision_added_ms"]["p50"] == pytest.approx(9.0, abs=1.0)
    assert units["decision_added_ms"]["max"] == pytest.approx(18.0, abs=0.5)
    assert abs(units["gap_minus_unit_ms"]["p99"]) < 0.5  # the 1 s cadence held
    assert abs(units["ticks_apart_minus_unit_ms"]["p99"]) < 0.5
    assert units["units_per_call_audio_s"]["p50"] == pytest.approx(1.0, abs=0.01)
    downlink = analyse_downlink(calls)
    assert downlink["audio_s_in"] == 120.0
    assert downlink["downlink_added_ms"]["n"] == 120
    assert "gap_minus_80ms_ms" not in downlink  # listen units send no audio: no per-tick cadence to read


def test_a_unit_tick_that_takes_longer_is_not_read_as_delay_of_its_callers():
    """A speaking tick ends 300 ms after a listening one: the spread within each tick is what the web tier adds,
    and the late tick shows as ticks further apart."""
    ticks = 1000.25 + np.arange(30.0) + np.where(np.arange(30) % 2 == 1, 0.3, 0.0)
    calls = [unit_call(i, ticks, spread_s=0.001 * i, spoken=0) for i in range(8)]
    units = analyse_units(calls)
    assert units["decision_added_ms"]["max"] == pytest.approx(7.0, abs=0.5)
    assert units["ticks_apart_minus_unit_ms"]["p1"] == pytest.approx(-300.0, abs=0.5)
    assert units["ticks_apart_minus_unit_ms"]["p99"] == pytest.approx(300.0, abs=0.5)
