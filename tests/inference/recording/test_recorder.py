"""The recorder writes real chunk files on a real writer thread; the reader gets the call back from them."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from inference.engines.base import SlotOutput
from inference.recording.chunks import END_FILE, META_FILE, chunk_files, folder_state
from inference.recording.reader import RawRecordingError, read_recording
from inference.recording.recorder import FLUSH_PERIOD_S, Recorder, record_steps

RATE, CHUNK, PERIOD_MS = 24_000, 1920, 80
META = {"engine": "echo", "input_rate": RATE, "output_rate": RATE, "chunk_period_ms": PERIOD_MS,
        "input_chunk_samples": CHUNK, "user_key": "7"}  # fmt: skip


def marker(value: int) -> np.ndarray:
    """A chunk whose every sample says which step it belongs to."""
    return np.full(CHUNK, value / 1000.0, dtype=np.float32)


def pcm(value: int) -> bytes:
    return (np.full(CHUNK, value, dtype="<i2")).tobytes()


def record_call(recorder: Recorder, session_id: str, steps: int, *, finish: bool = True):
    recording = recorder.begin(session_id, META)
    for step in range(steps):
        text = f" word{step}" if step % 5 == 0 else ""
        record_steps([recording.step_item(marker(step), pcm(step), SlotOutput(audio=np.zeros(0), text=text), 1.5)])
        if step == 3:
            recording.event("epoch", epoch=1, unplayed_ms=160.0)
        if step == 4:
            recording.event("ack", played_ms=200.0, sent_ms=320.0)
    if finish:
        recording.finish("client_close")
    return recording


def wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_recorded_call_reads_back_aligned(tmp_path):
    recorder = Recorder(tmp_path)
    recorder.start()
    record_call(recorder, "sess_a", 30)
    wait_for(lambda: folder_state(tmp_path / "sess_a") == "finished")
    recorder.stop()
    raw = read_recording(tmp_path / "sess_a")
    assert raw.problems == [] and not raw.interrupted
    assert raw.steps == 30 and len(raw.caller) == 30 * CHUNK and len(raw.agent) == 30 * CHUNK
    # Step k's audio sits at k * chunk on both tracks.
    for step in (0, 7, 29):
        assert raw.agent[step * CHUNK] == step
        assert abs(raw.caller[step * CHUNK + 5] - round(step / 1000 * 32767)) <= 1
    texts = [e for e in raw.events if e["k"] == "text"]
    assert [e["step"] for e in texts] == [0, 5, 10, 15, 20, 25]
    kinds = {e["k"] for e in raw.events}
    assert {"epoch", "ack"} <= kinds
    end = json.loads((tmp_path / "sess_a" / END_FILE).read_text())
    assert end["reason"] == "client_close" and end["steps"] == 30 and end["problem"] is None
    meta = json.loads((tmp_path / "sess_a" / META_FILE).read_text())
    assert meta["engine"] == "echo" and meta["service_id"] == recorder.instance_id


def test_files_are_flushed_within_a_second_while_the_call_runs(tmp_path):
    recorder = Recorder(tmp_path)
    recorder.start()
    record_call(recorder, "sess_live", 10, finish=False)
    time.sleep(FLUSH_PERIOD_S * 2 + 0.1)
    # Read while the session is still open, as a crash right now would leave the files.
    raw = read_recording(tmp_path / "sess_live")
    assert raw.steps == 10 and raw.end is None
    recorder.stop()


def test_a_full_queue_drops_and_counts_and_never_blocks(tmp_path):
    recorder = Recorder(tmp_path, max_pending=6)  # the writer is not started yet: a disk that does not move
    started = time.perf_counter()
    recording = record_call(recorder, "sess_slow", 50)
    assert time.perf_counter() - started < 0.5  # producers never waited for the disk
    assert recording.dropped_steps > 0
    recorder.start()
    wait_for(lambda: folder_state(tmp_path / "sess_slow") == "finished")
    recorder.stop()
    end = json.loads((tmp_path / "sess_slow" / END_FILE).read_text())
    assert end["dropped_steps"] == recording.dropped_steps
    assert "fell behind" in end["problem"]
    raw = read_recording(tmp_path / "sess_slow")
    assert any("fell behind" in p for p in raw.problems)


def test_a_burst_of_many_sessions_events_is_written_whole(tmp_path):
    """229 callers' acks arrive as one item per session: a second's burst (~460 items) fits in the default
    queue, and the writer, woken by the backlog, writes every one (the H200 run with a 64-item queue dropped
    hundreds and marked recordings partial)."""
    recorder = Recorder(tmp_path)
    recorder.start()
    recordings = [recorder.begin(f"sess_{i}", META) for i in range(229)]
    for second in range(2):
        for recording in recordings:
            recording.event("ack", played_ms=1000.0 * second, sent_ms=1000.0 * second + 80.0)
    for recording in recordings:
        recording.finish("client_close")
    wait_for(lambda: all(folder_state(tmp_path / f"sess_{i}") == "finished" for i in range(229)), timeout=20)
    recorder.stop()
    assert sum(r.dropped_events for r in recordings) == 0
    ends = [json.loads((tmp_path / f"sess_{i}" / END_FILE).read_text()) for i in range(229)]
    assert [end["problem"] for end in ends] == [None] * 229


def test_a_ticks_callers_are_written_exactly_as_each_alone(tmp_path):
    """One tick's steps for many sessions are one item: every session's caller track must be what its own frames
    give, a step without caller audio must stay a gap, and a frame of another length must come out whole."""
    rng = np.random.default_rng(7)
    recorder = Recorder(tmp_path)
    recorder.start()
    recordings = [recorder.begin(f"sess_{i}", META) for i in range(6)]
    sent = {i: [] for i in range(6)}
    for _ in range(4):
        steps = []
        for i, recording in enumerate(recordings):
            frame = (rng.integers(-32768, 32768, CHUNK if i != 4 else CHUNK // 2) / 32768.0).astype(np.float32)
            frame = None if i == 2 else frame  # no caller audio came in time for this session's steps
            if frame is not None:
                sent[i].append(np.clip(frame, -1.0, 32767 / 32768))
            steps.append(recording.step_item(frame, pcm(i), SlotOutput(audio=np.zeros(0)), 1.0))
        record_steps(steps)
    for recording in recordings:
        recording.finish("client_close")
    wait_for(lambda: all(folder_state(tmp_path / f"sess_{i}") == "finished" for i in range(6)))
    recorder.stop()
    for i in range(6):
        raw = read_recording(tmp_path / f"sess_{i}")
        assert raw.problems == [] and raw.steps == 4
        if i == 2:
            assert raw.caller_steps == {} and not raw.caller.any()  # gaps: no caller record, silence on the timeline
            continue
        # each step's own record (the timeline places steps by their wall-clock start, which a loaded machine moves)
        got = np.frombuffer(b"".join(raw.caller_steps[step] for step in range(4)), "<i2")
        np.testing.assert_array_equal(got, (np.concatenate(sent[i]) * 32768.0).astype(np.int16))


def test_a_corrupted_chunk_is_named_and_the_rest_is_read(tmp_path):
    recorder = Recorder(tmp_path)
    recorder.start()
    record_call(recorder, "sess_bad", 20)
    wait_for(lambda: folder_state(tmp_path / "sess_bad") == "finished")
    recorder.stop()
    chunk = chunk_files(tmp_path / "sess_bad")[0]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    raw = read_recording(tmp_path / "sess_bad")
    assert len(raw.problems) == 1 and raw.problems[0].startswith(f"{chunk.name}: ")
    assert 0 < raw.steps < 20


def test_a_truncated_chunk_of_a_finished_call_is_a_problem(tmp_path):
    recorder = Recorder(tmp_path)
    recorder.start()
    record_call(recorder, "sess_cut", 20)
    wait_for(lambda: folder_state(tmp_path / "sess_cut") == "finished")
    recorder.stop()
    chunk = chunk_files(tmp_path / "sess_cut")[0]
    chunk.write_bytes(chunk.read_bytes()[:-100])
    raw = read_recording(tmp_path / "sess_cut")
    assert raw.problems and "truncated" in raw.problems[0] and chunk.name in raw.problems[0]


def test_nothing_usable_raises_a_typed_error(tmp_path):
    (tmp_path / "sess_empty").mkdir()
    with pytest.raises(RawRecordingError, match="meta.json"):
        read_recording(tmp_path / "sess_empty")
    (tmp_path / "sess_empty" / META_FILE).write_text(json.dumps(META))
    (tmp_path / "sess_empty" / "chunk-000000.prc").write_bytes(b"garbage that is not a record")
    with pytest.raises(RawRecordingError, match="chunk-000000.prc"):
        read_recording(tmp_path / "sess_empty")


def test_a_restarted_recorder_marks_a_dead_services_recordings_interrupted(tmp_path):
    recorder = Recorder(tmp_path)
    recorder.start()
    record_call(recorder, "sess_killed", 12, finish=False)
    time.sleep(FLUSH_PERIOD_S * 2 + 0.1)
    # A killed process writes nothing more: simulate it by pretending the writer's pid is gone.
    meta_path = tmp_path / "sess_killed" / META_FILE
    meta = json.loads(meta_path.read_text())
    meta["pid"] = 2**22 + 12345  # above pid_max's default: no such process
    meta_path.write_text(json.dumps(meta))
    chunk = chunk_files(tmp_path / "sess_killed")[0]
    chunk.write_bytes(chunk.read_bytes()[:-7])  # the kill cut the last record short
    restarted = Recorder(tmp_path)
    assert restarted.recover_interrupted() == ["sess_killed"]
    raw = read_recording(tmp_path / "sess_killed")
    assert raw.interrupted and raw.problems == []  # a cut tail of a killed call is expected, not damage
    # Only step 11's agent audio was cut: its time is still on the timeline, silent.
    assert raw.steps == 12 and len(raw.agent) == 12 * CHUNK
    assert raw.agent[10 * CHUNK : 11 * CHUNK].any() and not raw.agent[11 * CHUNK :].any()
    recorder.stop()


def test_a_live_services_open_recording_is_left_alone(tmp_path):
    recorder = Recorder(tmp_path)
    recorder.start()
    record_call(recorder, "sess_other", 3, finish=False)
    wait_for(lambda: (tmp_path / "sess_other" / META_FILE).exists())
    meta_path = tmp_path / "sess_other" / META_FILE
    meta = json.loads(meta_path.read_text())
    meta["pid"] = 1  # init: alive, and not this process
    meta_path.write_text(json.dumps(meta))
    assert Recorder(tmp_path).recover_interrupted() == []
    recorder.stop()


def test_a_disk_write_error_ends_the_recording_partial_with_the_reason(tmp_path):
    recorder = Recorder(tmp_path)
    recorder.start()
    recording = recorder.begin("sess_disk", META)
    wait_for(lambda: (tmp_path / "sess_disk" / META_FILE).exists())
    (tmp_path / "sess_disk" / "chunk-000000.prc").mkdir()  # the chunk cannot be opened for writing
    for step in range(5):
        record_steps([recording.step_item(marker(step), pcm(step), SlotOutput(audio=np.zeros(0)), 1.0)])
    recording.finish("client_close")
    wait_for(lambda: folder_state(tmp_path / "sess_disk") == "finished")
    recorder.stop()
    end = json.loads((tmp_path / "sess_disk" / END_FILE).read_text())
    assert end["problem"].startswith("disk write failed") and end["lost_after_error"] == 5


def test_unit_engine_decisions_are_recorded_with_their_unit(tmp_path):
    recorder = Recorder(tmp_path)
    recorder.start()
    recording = recorder.begin("sess_units", {**META, "chunk_period_ms": 1000, "input_chunk_samples": CHUNK})
    for unit, kind in enumerate(["listen", "speak", "speak"]):
        out = SlotOutput(audio=np.zeros(0), decision=kind, end_of_turn=unit == 2)
        record_steps([recording.step_item(marker(unit), pcm(unit), out, 40.0)])
    recording.finish("client_close")
    wait_for(lambda: folder_state(tmp_path / "sess_units") == "finished")
    recorder.stop()
    raw = read_recording(tmp_path / "sess_units")
    decisions = [(e["step"], e["kind"], e["eot"]) for e in raw.events if e["k"] == "decision"]
    assert decisions == [(0, "listen", False), (1, "speak", False), (2, "speak", True)]


def test_a_second_recorder_in_the_same_process_leaves_the_firsts_open_recordings_alone(tmp_path):
    first = Recorder(tmp_path)
    first.start()
    record_call(first, "sess_running", 3, finish=False)
    wait_for(lambda: (tmp_path / "sess_running" / META_FILE).exists())
    second = Recorder(tmp_path)
    second.start()  # e.g. two in-process services on one folder
    assert folder_state(tmp_path / "sess_running") == "open"
    second.stop()
    first.stop()  # the first one's own stop ends it
    assert json.loads((tmp_path / "sess_running" / END_FILE).read_text())["reason"] == "interrupted"
