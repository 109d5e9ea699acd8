"""The recorder: per-session chunk files written by one writer thread per service, off the hot path.

The worker thread and the session's event loop only append small tuples to a deque (no lock held
while the disk works; one item per tick for all its sessions). Data items wake nobody: the writer
takes what waits every ``FLUSH_PERIOD_S / 2``, or when ``WAKE_AT`` items wait (a wake-up per item was a
thread switch and a GIL hand-off per caller event, measurable at a few hundred callers); the control items
(start, end, stop) wake it at once. The writer turns the items into records (``inference.recording.chunks``) and
appends each session's records to its current chunk file every ``FLUSH_PERIOD_S``, so a killed
service loses at most that much.

A slow or full disk never stalls a tick: when more than ``max_pending`` items wait, new step and
event items are dropped and counted on the recording, and ``end.json`` says so (the catalogue then
marks the recording ``partial``). Only the two control items of a session (start and end) always go
in, so a recording is never left without its end marker by a full queue.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from inference.recording.chunks import (
    CHUNK_ROLL_S,
    END_FILE,
    META_FILE,
    STEP,
    TICK,
    Kind,
    chunk_name,
    encode_event,
    encode_record,
    read_json,
    write_json,
)

logger = logging.getLogger(__name__)

FLUSH_PERIOD_S = 0.5  # well inside the promised second, with room for a slow write
# Queued items beyond which new ones are dropped and counted. A tick's steps are one item for all sessions, but
# events (acks, echo windows) are one per session: 229 callers make ~460 a second, so 64 items overflowed within
# a quarter second (H200 run, bench/notes/serving-e2e.md). 1024 holds seconds of either; at 229 callers a tick's
# item is ~1.7 MB of audio, and a stalled disk reaches the limit with ~30 of them queued.
DEFAULT_MAX_PENDING = 1024
WAKE_AT = 16  # data items wake the writer only once this many wait: a hand-off per batch, not per item
FORMAT_VERSION = 3  # 2: a step whose caller audio did not arrive has no caller record (a gap, not silence);
# 3: camera frames the engine saw and the agent's tokens, when the engine reports them
_running_here: set[str] = set()  # instance ids of this process's started recorders (several services may share one)


class SessionRecording:
    """One session's recording; the session and the worker feed it, the writer thread owns its files.

    ``step`` and ``dropped_steps`` are written by the worker thread only, ``dropped_events`` by the
    session's loop only: each counter has one writer, so no lock is needed.
    """

    def __init__(self, recorder: Recorder, session_id: str, *, video: bool = True):
        self.recorder = recorder
        self.video = video  # keep the camera frames the engine saw (the caller may turn this off on its own)
        self.session_id = session_id
        self.folder = recorder.root / session_id
        self.started = time.monotonic()
        self.step = 0
        self.dropped_steps = 0
        self.dropped_events = 0
        self.finished = False

    def seconds(self) -> float:
        return time.monotonic() - self.started

    # ---- worker thread ----------------------------------------------------------------------

    def step_item(
        self, caller: np.ndarray | None, agent_pcm16: bytes, output: Any, step_ms: float, frame: bytes | None = None
    ) -> tuple[Any, ...]:
        """One engine step of this session (the input it got, what it sent, its text and decision).

        ``caller`` None: no caller audio arrived for this step (the engine was fed silence); the reader
        keeps that time as a marked gap. ``frame``: the camera frame the engine saw this step, kept only
        while the session records video."""
        step, self.step = self.step, self.step + 1
        frame = frame if self.video else None
        tokens = getattr(output, "tokens", None)
        return (self, step, self.seconds(), caller, agent_pcm16, output.text, output.decision, output.end_of_turn,
                step_ms, frame, tokens)  # fmt: skip

    # ---- session loop -----------------------------------------------------------------------

    def event(self, kind: str, **fields: Any) -> None:
        """A session event (pause, resume, detach, attach, epoch, playback ack ...) at this moment."""
        if self.finished:
            return
        item = ("event", self, {"k": kind, "t": round(self.seconds(), 4), "step": self.step, **fields})
        if not self.recorder.offer(item):
            self.dropped_events += 1

    def finish(self, reason: str) -> None:
        """The session ended: the writer closes the files and writes ``end.json``."""
        if not self.finished:
            self.finished = True
            self.recorder.control(("end", self, {"reason": reason, "duration_s": round(self.seconds(), 3)}))


@dataclass
class _OpenFiles:
    """The writer thread's state for one recording."""

    folder: Path
    chunk: BinaryIO | None = None
    chunk_index: int = -1
    chunk_started_s: float = 0.0
    bytes_written: int = 0
    problem: str | None = None  # the first write error; nothing more is written for this recording
    lost: int = 0  # records lost to a write error (buffered when it happened, or arriving after it)
    pending: list[bytes] = field(default_factory=list)  # records waiting for the next flush


class Recorder:
    """Owns the writer thread and every open recording of one service.

    Args:
        root: the folder holding one sub-folder per recorded session.
        max_pending: items allowed to wait for the writer before new ones are dropped.
    """

    def __init__(self, root: Path, *, max_pending: int = DEFAULT_MAX_PENDING):
        self.root = Path(root)
        self.max_pending = max_pending
        self.instance_id = uuid.uuid4().hex
        self._items: deque[tuple[Any, ...] | None] = deque()  # append/popleft are atomic: no lock needed
        self._wake = threading.Event()
        self._open: dict[SessionRecording, _OpenFiles] = {}
        self._thread = threading.Thread(target=self._run, name="recorder-writer", daemon=True)

    # ---- lifecycle (service loop) ---------------------------------------------------------------

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.recover_interrupted()
        _running_here.add(self.instance_id)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, then end every recording still open as ``interrupted``."""
        if self._thread.is_alive():
            self.control(None)
            self._thread.join(timeout)
        _running_here.discard(self.instance_id)

    def begin(self, session_id: str, meta: dict[str, Any], *, video: bool = True) -> SessionRecording:
        """Start recording a session; ``meta`` (engine, rates, persona ...) goes to ``meta.json``."""
        recording = SessionRecording(self, session_id, video=video)
        started = {"started_at": time.time(), "pid": os.getpid(), "service_id": self.instance_id}
        self.control(("begin", recording, {"format": FORMAT_VERSION, "session_id": session_id, **meta, **started}))
        return recording

    def recover_interrupted(self) -> list[str]:
        """End the recordings that a killed service left open: ``end.json`` with reason ``interrupted``.

        A folder whose writer still runs (another service process on the same folder, or another
        service's recorder in this process) is left alone. Returns the session ids marked.
        """
        marked = []
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            if (folder / END_FILE).exists():
                continue
            meta = read_json(folder / META_FILE) or {}
            pid = meta.get("pid")
            if isinstance(pid, int) and pid != os.getpid() and _process_alive(pid):
                continue
            if pid == os.getpid() and meta.get("service_id") in _running_here:
                continue
            # The last write is when the call was cut (to within a flush period), not now.
            last_write = max((p.stat().st_mtime for p in folder.iterdir() if p.is_file()), default=time.time())
            write_json(folder / END_FILE, {"reason": "interrupted", "interrupted": True, "ended_at": last_write})
            marked.append(folder.name)
        if marked:
            logger.warning("recorder: %d recording(s) of a stopped service marked interrupted", len(marked))
        return marked

    # ---- producers (any thread) -------------------------------------------------------------------

    def offer(self, item: tuple[Any, ...]) -> bool:
        """Queue a data item unless the writer is too far behind; False = dropped."""
        waiting = len(self._items)
        if waiting >= self.max_pending:
            return False
        self._items.append(item)
        if waiting + 1 == WAKE_AT:
            self._wake.set()
        return True

    def control(self, item: tuple[Any, ...] | None) -> None:
        """Queue a start or end item (``None``: stop the writer) and wake the writer for it."""
        self._items.append(item)
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._items)

    # ---- writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        last_flush = time.monotonic()
        stopping = False
        while not stopping:
            self._wake.wait(FLUSH_PERIOD_S / 2)
            self._wake.clear()
            while self._items:
                item = self._items.popleft()
                if item is None:
                    stopping = True  # what was queued before the stop is written; nothing after it
                    break
                try:
                    self._handle(item)
                except Exception:  # noqa: BLE001 - one bad item must not end every recording
                    logger.exception("recorder: could not write %s", item[0])
            now = time.monotonic()
            if now - last_flush >= FLUSH_PERIOD_S:
                self._flush_all()
                last_flush = now
        for recording in list(self._open):
            self._end(recording, {"reason": "interrupted", "interrupted": True})

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind, recording = item[0], item[1]
        if kind == "steps":
            for recording, *step in item[1]:
                state = self._open.get(recording)
                if state is not None:
                    self._write(state, _step_records(*step), step[1])
            return
        if kind == "begin":
            self._begin(recording, item[2])
            return
        state = self._open.get(recording)
        if state is None:
            return  # begin failed (logged); nothing of this recording can be written
        if kind == "end":
            self._end(recording, item[2])
        elif kind == "event":
            self._write(state, encode_event(item[2]), item[2]["t"])

    def _begin(self, recording: SessionRecording, meta: dict[str, Any]) -> None:
        state = _OpenFiles(recording.folder)
        self._open[recording] = state
        try:
            recording.folder.mkdir(parents=True, exist_ok=True)
            write_json(recording.folder / META_FILE, meta)
        except OSError as exc:
            state.problem = f"could not start the recording: {exc}"
            logger.error("recorder: %s: %s", recording.session_id, state.problem)

    def _write(self, state: _OpenFiles, data: bytes, seconds: float) -> None:
        """Buffer ``data``; the buffer goes to disk at the next flush (one write per file per flush
        period instead of one per step: far fewer system calls, and fewer GIL hand-overs with the tick)."""
        if state.problem is not None:
            state.lost += 1
            return
        if state.chunk is None or seconds - state.chunk_started_s >= CHUNK_ROLL_S:
            self._drain(state)
            if state.problem is not None:
                state.lost += 1
                return
            self._roll(state, seconds)
        state.pending.append(data)

    def _roll(self, state: _OpenFiles, seconds: float) -> None:
        self._close_chunk(state)
        state.chunk_index += 1
        state.chunk_started_s = seconds
        try:
            state.chunk = open(state.folder / chunk_name(state.chunk_index), "ab")  # noqa: SIM115 - kept open
        except OSError as exc:
            self._fail(state, exc)

    def _drain(self, state: _OpenFiles) -> None:
        """Append the buffered records to the current chunk and hand them to the OS."""
        if state.chunk is None or state.problem is not None or not state.pending:
            return
        data = b"".join(state.pending)
        state.pending.clear()
        try:
            state.chunk.write(data)
            state.chunk.flush()
            state.bytes_written += len(data)
        except OSError as exc:
            self._fail(state, exc)

    def _fail(self, state: _OpenFiles, exc: OSError) -> None:
        state.problem = f"disk write failed: {exc}"
        state.lost += len(state.pending) + 1
        state.pending.clear()
        logger.error("recorder: %s: %s", state.folder.name, state.problem)
        self._close_chunk(state)

    def _close_chunk(self, state: _OpenFiles) -> None:
        if state.chunk is not None:
            try:
                state.chunk.close()
            except OSError as exc:
                state.problem = state.problem or f"disk write failed: {exc}"
            state.chunk = None

    def _flush_all(self) -> None:
        for state in self._open.values():
            self._drain(state)

    def _end(self, recording: SessionRecording, fields: dict[str, Any]) -> None:
        state = self._open.pop(recording)
        self._drain(state)
        self._close_chunk(state)
        dropped = recording.dropped_steps + recording.dropped_events
        end = {
            **fields,
            "ended_at": time.time(),
            "steps": recording.step,
            "dropped_steps": recording.dropped_steps,
            "dropped_events": recording.dropped_events,
            "lost_after_error": state.lost,
            "bytes": state.bytes_written,
            "problem": state.problem or (f"the recorder fell behind: {dropped} item(s) dropped" if dropped else None),
        }
        try:
            write_json(recording.folder / END_FILE, end)
        except OSError as exc:  # the next start marks it interrupted; the chunks are still there
            logger.error("recorder: %s: could not write end.json: %s", recording.session_id, exc)


def record_steps(steps: list[tuple[Any, ...]]) -> None:
    """Worker thread, once at the end of a tick: hand that tick's steps (``step_item``s) to their recorders.

    One queue item per tick rather than one per session: the writer thread wakes once, after the
    tick's work is done, instead of competing for the GIL with the tick while it runs.
    """
    by_recorder: dict[Recorder, list[tuple[Any, ...]]] = {}
    for item in steps:
        by_recorder.setdefault(item[0].recorder, []).append(item)
    for recorder, items in by_recorder.items():
        if not recorder.offer(("steps", items)):
            for item in items:
                item[0].dropped_steps += 1


def _step_records(
    step: int,
    seconds: float,
    caller: np.ndarray | None,
    agent_pcm16: bytes,
    text: str,
    decision: str | None,
    end_of_turn: bool,
    step_ms: float,
    frame: bytes | None = None,
    tokens: Any = None,
) -> bytes:
    """One step's records: the tick timing, both audio payloads, the frame and tokens, and text/decision if any."""
    prefix = STEP.pack(step)
    parts = [encode_record(Kind.TICK, TICK.pack(step, seconds, step_ms))]
    if caller is not None:
        parts.append(encode_record(Kind.CALLER_AUDIO, prefix + _caller_pcm16(caller)))
    parts.append(encode_record(Kind.AGENT_AUDIO, prefix + agent_pcm16))
    if frame:
        parts.append(encode_record(Kind.FRAME, prefix + frame))
    if tokens is not None:
        parts.append(encode_record(Kind.TOKENS, prefix + np.asarray(tokens, dtype="<i4").tobytes()))
    if text:
        parts.append(encode_event({"k": "text", "t": round(seconds, 4), "step": step, "text": text}))
    if decision is not None:
        parts.append(
            encode_event({"k": "decision", "t": round(seconds, 4), "step": step, "kind": decision, "eot": end_of_turn})
        )
    return b"".join(parts)


def _caller_pcm16(samples: np.ndarray) -> bytes:
    """float32 -> int16, exact for audio that came in as pcm16 (k / 32768), in two passes.

    Leaner than ``pcm.encode_pcm16`` (no NaN scrub, no rounding pass): the session already refused
    NaN/Inf input, and this runs for every session on every tick.
    """
    return (np.clip(samples, -1.0, 32767 / 32768) * 32768.0).astype("<i2").tobytes()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
