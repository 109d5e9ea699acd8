"""bench/framer_trace.py on a trace whose answer is known: which frames went with the tick after their send, and
where they waited (the lane after the tick, or the framer holding them)."""

from __future__ import annotations

import json

import numpy as np

from bench import framer_trace

PERIOD = framer_trace.PERIOD_S
DELAY = framer_trace.DELAY_FRAMES * PERIOD


def write_trace(tmp_path, *, frames: int = 20, held: tuple[int, ...] = (5, 6), late_to_lane: int = 7) -> None:
    ticks = 1.0 + PERIOD * np.arange(frames + 5)
    sent = ticks[:frames] - 0.012  # each frame sent 12 ms before its tick
    lane = sent + 0.001  # ... and read 1 ms later
    lane[late_to_lane] = ticks[late_to_lane] + 0.002  # this one reached the lane after its tick
    echoed = ticks[:frames] + DELAY + 0.004
    for k in (*held, late_to_lane):
        echoed[k] += PERIOD  # these went with the next tick
    np.savez(tmp_path / "calls.npz", sent_0=sent, echoed_0=echoed, lines=np.array([0]))
    np.savetxt(tmp_path / "ticks-1.txt", ticks, fmt="%.6f")
    np.savetxt(tmp_path / "lane-1.txt", np.column_stack([lane, np.arange(frames)]), fmt="%.6f %d")
    # one framer: a take that found nothing, then two takes that left a whole frame, then one that left part of one
    standing = np.zeros(frames)
    found = np.zeros(frames)
    found[10], standing[11:13], standing[13] = -1, 80.0, 20.0
    takes = np.column_stack([ticks[:frames], np.full(frames, 7), standing, np.full(frames, 5.0), found])
    np.savetxt(tmp_path / "takes-1.txt", takes, fmt="%.6f %d %.1f %.1f %d")


def test_frames_a_tick_later_are_split_by_where_they_waited(tmp_path):
    write_trace(tmp_path)
    out = tmp_path / "result.json"
    assert framer_trace.main([str(tmp_path), "--skip-s", "0", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    frames = result["frames"]
    assert frames["frames"] == 20
    assert frames["a_tick_later"] == 0.15  # 3 of 20
    assert frames["of_those_reached_lane_before_tick"] == 0.6667  # the two held; the third came to the lane late
    assert frames["tick_wait_ms"]["p50"] == 12.0
    assert frames["server_added_ms"]["p50"] == 4.0 and frames["server_added_ms"]["max"] == 84.0
    assert frames["send_to_lane_ms"]["p50"] == 1.0
    [band] = [b for b in frames["by_lead"] if b["frames"]]
    assert band["sent_ms_before_tick"] == "10-15" and band["reached_lane_after_tick"] == 0.05
    takes = result["takes"]
    assert takes["takes"] == 19  # the first take is the trace's own start, left out with the ramp
    assert takes["found_nothing"] == round(1 / 19, 4)
    assert takes["left_a_whole_frame_standing"] == round(2 / 19, 4)
    assert takes["left_part_of_a_frame_standing"] == round(1 / 19, 4)
    assert takes["whole_frame_standing_right_after_nothing_found"] == 1.0


def test_a_trace_of_several_web_processes_is_refused(tmp_path):
    write_trace(tmp_path)
    (tmp_path / "ticks-2.txt").write_text("1.0\n")
    try:
        framer_trace.main([str(tmp_path)])
    except SystemExit as exc:
        assert "expected one ticks" in str(exc)
    else:
        raise AssertionError("two web processes' ticks were read as one")
