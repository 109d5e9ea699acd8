"""The engine worker: one thread per engine/device stepping the slot batch on a real clock.

The asyncio side never touches the engine. It sends commands (open, close, freeze, cancel ...) to
this thread, pushes input chunks into each slot's bounded inbox, and receives outputs and
confirmations through ``loop.call_soon_threadsafe``.

Every tick: run queued commands, take one frame from each live slot's inbox, a tick-aligned framer
(``inference.audio.framing``: the frame ends with the audio that arrived just before the tick;
silence and an underrun when nothing came; frozen slots are left out of the step), ``engine.step``,
hand the outputs to the recordings and to the listeners at once, each with the input position its tick had
heard (``inference.slots.delivery``). A tick that overruns its deadline is counted as late; the clock does
not burst to catch up.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from inference.audio.framing import TickAlignedFramer
from inference.audio.phase_advice import PhaseAdvice
from inference.engines.base import ChatRequest, Engine, SlotConfig, SlotInput, SlotOutput, SlotTurn
from inference.slots.chats import ChatJobs, ChatListener
from inference.slots.delivery import SlotListener, hand_off, post_to
from inference.slots.timing import TimingRing

if TYPE_CHECKING:
    from inference.recording.recorder import SessionRecording

logger = logging.getLogger(__name__)

CLOSE_ATTEMPTS = 3
CHAT_SHARE = 0.5  # of each tick, chat replies may take this much beside duplex calls (all of it when none)


@dataclass
class WorkerSlot:
    """The worker's view of one slot. Counters are written by the worker thread only."""

    index: int
    inbox: TickAlignedFramer  # the session's input samples; each tick takes one aligned frame
    listener: SlotListener | None = None
    loop: asyncio.AbstractEventLoop | None = None
    recording: SessionRecording | None = None  # gets each step's input and output when the session is recorded
    opened: bool = False
    prefilling: bool = False
    prefill_reported: bool = False  # the engine returned prefilling=True for this slot
    frozen: bool = False
    failed: bool = False
    image: bytes | None = None
    force_listen: bool = False
    turn: SlotTurn = "free"  # turn-based sessions: listen or respond on every unit until told otherwise
    frames_in: int = 0
    frames_out: int = 0
    underruns: int = 0
    dropped_in: int = 0  # input discarded around a prefill: all but the newest frame during it, stale audio at its end
    heard_position: int | None = None  # input stream position the current tick's frame ends at (None: underrun)
    max_in_wait_s: float = 0.0  # longest wait of a chunk in the inbox; read and reset by take_slot_counters
    close_attempts: int = 0
    pending_close: list[Callable[[], None]] = field(default_factory=list)


@dataclass(frozen=True)
class SlotCounters:
    """One slot's counters for its session's Metrics event (a copy: sessions never touch ``WorkerSlot``)."""

    frames_in: int
    frames_out: int
    underruns: int
    dropped_in: int
    trimmed: int
    inbox_depth: float  # frames' worth of input waiting
    max_in_wait_s: float  # longest inbox wait since the previous take
    phase_advice: PhaseAdvice | None = None  # where the client should cut its pieces (the framer's latest window)


@dataclass(frozen=True)
class WorkerStats:
    """What the occupancy view and the Metrics events need from the worker."""

    tick_ms_p50: float
    tick_ms_p99: float
    recent_tick_ms: tuple[float, ...]
    ticks: int
    late_ticks: int


class EngineWorker:
    """Runs one engine on its own thread.

    Args:
        engine: a warmed-up engine; only this worker's thread touches it after ``start()``.
        inbox_frames: bound of each slot's input queue; overflow drops the oldest chunk.
        name: thread name, e.g. ``"engine-echo-cpu"``.
    """

    def __init__(self, engine: Engine, *, inbox_frames: int = 16, name: str = "engine-worker"):
        self.engine = engine
        caps = engine.capabilities
        self.period_s = caps.chunk_period_ms / 1000.0
        self._silence = np.zeros(caps.input_chunk_samples, dtype=np.float32)
        self._frame = caps.input_chunk_samples
        self.slots = [
            WorkerSlot(i, TickAlignedFramer(caps.input_chunk_samples, caps.input_rate, max_frames=inbox_frames))
            for i in range(engine.num_slots)
        ]
        self._commands: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.tick_ms = TimingRing()
        self.ticks = 0
        self.late_ticks = 0
        self._stats: tuple[int, int, WorkerStats] | None = None  # (ticks, late ticks, stats) last read
        # (engine.admissible_sessions(), the slots open in the engine) as of the last tick or close, read by the
        # pool on the loop: sessions it admitted whose slot is not open yet are not in the count. One tuple
        # assignment, so the pool never sees a count with another moment's open slots.
        self.admission: tuple[int | None, frozenset[int]] = (None, frozenset())
        self.chats = ChatJobs(engine)

    # ---- asyncio side -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; open slots are closed in the engine on the way out."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def open(
        self,
        slot: int,
        config: SlotConfig,
        listener: SlotListener,
        loop: asyncio.AbstractEventLoop,
        recording: SessionRecording | None = None,
    ) -> None:
        """Open ``slot`` in the engine with ``config``; outputs go to ``listener`` on ``loop``."""
        self._send("open", slot, config, listener, loop, recording)

    def close(self, slot: int, on_closed: Callable[[], None], loop: asyncio.AbstractEventLoop) -> None:
        """Close ``slot`` (if open) and call ``on_closed`` on ``loop`` once the engine confirmed cleanup."""
        self._send("close", slot, on_closed, loop)

    def freeze(self, slot: int, frozen: bool) -> None:
        """A frozen slot is left out of step() (paused or detached session); its state is kept."""
        self._send("freeze", slot, frozen)

    def cancel(self, slot: int) -> None:
        self._send("cancel", slot)

    def force_listen(self, slot: int) -> None:
        self._send("force_listen", slot)

    def set_image(self, slot: int, image: bytes) -> None:
        self._send("image", slot, image)

    def chat(self, slot: int, request: ChatRequest, listener: ChatListener, loop: asyncio.AbstractEventLoop) -> None:
        """Chat mode: generate the reply to ``request`` on ``slot`` (held, not opened); pieces go to ``listener``."""
        self._send("chat", slot, request, listener, loop)

    def set_turn(self, slot: int, turn: SlotTurn) -> None:
        """Turn-based sessions: every following unit listens or responds (``free``: the engine decides)."""
        self._send("turn", slot, turn)

    def push(self, slot: int, samples: np.ndarray) -> bool:
        """Queue input samples (any length); returns False when the inbox was full and its oldest audio was dropped.

        A prefilling slot drops old audio anyway (it keeps only the newest frame), so a long prefill tick
        that lets the inbox overflow is not backpressure.
        """
        s = self.slots[slot]
        return s.inbox.push(samples) == 0 or s.prefilling

    def take_slot_counters(self, slot: int) -> SlotCounters:
        """A copy of ``slot``'s counters; its longest inbox wait starts again from 0.

        The worker thread writes these fields while this reads them: a reading one tick stale, or a
        wait recorded between the read and the reset and so lost, only blurs one Metrics event.
        """
        counters = self.peek_slot_counters(slot)
        self.slots[slot].max_in_wait_s = 0.0
        return counters

    def peek_slot_counters(self, slot: int) -> SlotCounters:
        """A copy of ``slot``'s counters that resets nothing (the operations console reads it twice a second)."""
        s = self.slots[slot]
        trimmed = round(s.inbox.dropped / self._frame)  # alignment and standing-queue trims, in frames
        # what the first take after a prefill (or a pause) found from before it: discarded like the prefill's
        dropped_in = s.dropped_in + round(s.inbox.stale_dropped / self._frame)
        depth = round(s.inbox.pending / self._frame, 2)
        return SlotCounters(
            s.frames_in, s.frames_out, s.underruns, dropped_in, trimmed, depth, s.max_in_wait_s, s.inbox.advice
        )

    def stats(self) -> WorkerStats:
        # Every session reads these for its once-a-second metrics: a few hundred reads a second of the
        # same ring, which changes once per tick. Recomputed only when a tick has run since the last read.
        cached = self._stats
        if cached is not None and cached[0] == self.ticks and cached[1] == self.late_ticks:
            return cached[2]
        ticks, late = self.ticks, self.late_ticks
        p50, p99 = self.tick_ms.percentiles()
        stats = WorkerStats(p50, p99, self.tick_ms.recent(100), ticks, late)
        self._stats = (ticks, late, stats)
        return stats

    def _send(self, *command: Any) -> None:
        self._commands.put(command)
        self._wake.set()

    # ---- worker thread ----------------------------------------------------------------------

    def _run(self) -> None:
        deadline = time.perf_counter()
        try:
            while not self._stop.is_set():
                deadline += self.period_s
                self._tick()
                now = time.perf_counter()
                if now > deadline:
                    self.late_ticks += 1
                    deadline = now  # no catch-up burst: the next tick is one period from now
                # Sleep to the deadline, but wake for commands so closes are confirmed promptly.
                while not self._stop.is_set():
                    remaining = deadline - time.perf_counter()
                    if remaining <= 0:
                        break
                    if self._wake.wait(remaining):
                        self._wake.clear()
                        self._run_commands()
        finally:
            self._shutdown_slots()

    def _tick(self) -> None:
        started = time.perf_counter()
        self._run_commands()
        self._retry_closes()
        stepped = self._step(started)
        if not stepped:
            # No slot is open: the last ticks timed calls that are gone. Kept, a window over the admission
            # budget would stay over it with nothing left to tick, and refuse every caller for good (the unit
            # engine on the H200 at ca438c1, after its calls failed at once). An idle engine has no tick times.
            self.tick_ms.clear()
        self._publish_admission()
        if self.chats.replies:
            self.chats.advance(started + self.period_s * (CHAT_SHARE if stepped else 0.95))

    def _step(self, started: float) -> bool:
        """One engine step over the open slots; False when none is open."""
        open_slots = [s for s in self.slots if s.opened and not s.failed]
        if not open_slots:
            return False
        inputs: dict[int, SlotInput] = {}
        for s in open_slots:
            if s.prefilling:
                # Once the engine says it is prefilling (seconds, for a voice prompt), keep only the
                # newest frame: a backlog built up meanwhile would stay on as latency. Before that
                # (the first tick after open) nothing is dropped, so an engine without prefill loses
                # no audio.
                if s.prefill_reported:
                    s.dropped_in += -(-s.inbox.keep_newest(self._frame) // self._frame)
            elif not s.frozen:
                inputs[s.index] = self._take_input(s)
        try:
            outputs = self.engine.step(inputs)
        except Exception as exc:  # noqa: BLE001 - any engine fault ends the affected sessions only
            logger.exception("engine.step failed")
            for s in open_slots:
                if s.index in inputs or s.prefilling:
                    self._fail(s, f"engine step failed: {type(exc).__name__}: {exc}")
            return True
        step_ms = (time.perf_counter() - started) * 1000.0
        ready: list[tuple[WorkerSlot, SlotOutput]] = []
        for s in open_slots:
            out = outputs.get(s.index)
            if s.prefilling and out is not None and out.prefilling:
                s.prefill_reported = True
            elif s.prefilling:
                s.prefilling = False  # prefill done: the slot takes input from the next tick
                if s.prefill_reported:  # ... after a real prefill, from the newest audio, in phase with the tick
                    # A caller that held its audio while the model prepared (the call page does) left only
                    # audio from before the prefill: gone too, or the first frame the model hears is a second
                    # old and stands as latency until a trim.
                    s.dropped_in += -(-s.inbox.drop_if_stale(self.period_s) // self._frame)
                    s.inbox.realign()
                if out is None:
                    out = SlotOutput(audio=np.zeros(0, dtype=np.float32), progress=1.0)
            if out is not None:
                ready.append((s, out))
        hand_off(open_slots, ready, inputs, step_ms)
        self.ticks += 1
        self.tick_ms.add((time.perf_counter() - started) * 1000.0)
        return True

    def _take_input(self, s: WorkerSlot) -> SlotInput:
        # The framer keeps the frame in phase with this tick and trims a standing queue itself.
        taken = s.inbox.take()
        if taken is None:
            audio, s.heard_position = self._silence, None
            s.underruns += 1
        else:
            audio, s.heard_position = taken.audio, taken.end_position
            s.frames_in += 1
            s.underruns += taken.short  # late audio: the frame was padded in front
            s.max_in_wait_s = max(s.max_in_wait_s, taken.wait_s)
        slot_input = SlotInput(audio=audio, image=s.image, force_listen=s.force_listen, turn=s.turn)
        s.image, s.force_listen = None, False
        return slot_input

    def _run_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            name, slot, *args = command
            getattr(self, f"_cmd_{name}")(self.slots[slot], *args)

    def _cmd_open(self, s: WorkerSlot, config: SlotConfig, listener: SlotListener, loop, recording) -> None:
        s.listener, s.loop, s.recording = listener, loop, recording
        s.frozen = s.failed = False
        s.frames_in = s.frames_out = s.underruns = s.dropped_in = 0
        try:
            self.engine.open_slot(s.index, config)
        except Exception as exc:  # noqa: BLE001 - the session gets engine_failed, the worker goes on
            logger.exception("engine.open_slot(%d) failed", s.index)
            self._fail(s, f"could not open slot: {type(exc).__name__}: {exc}")
            return
        s.opened = True
        # until a step reports otherwise; a slot with nothing to prefill is stepped with input at once
        s.prefilling = not self.engine.live_at_open(s.index)
        s.prefill_reported = False

    def _cmd_close(self, s: WorkerSlot, on_closed: Callable[[], None], loop) -> None:
        self.chats.stop(s.index)
        s.pending_close.append(lambda: post_to(loop, on_closed))
        s.close_attempts = 0
        self._close_now(s)

    def _close_now(self, s: WorkerSlot) -> None:
        if s.opened:
            try:
                self.engine.close_slot(s.index)
            except Exception:  # noqa: BLE001 - retried on the next ticks, then given up loudly
                s.close_attempts += 1
                logger.exception("engine.close_slot(%d) failed (attempt %d)", s.index, s.close_attempts)
                if s.close_attempts < CLOSE_ATTEMPTS:
                    return
                logger.error("slot %d: cleanup never confirmed; freeing it anyway", s.index)
        s.opened = s.prefilling = s.frozen = s.failed = False
        s.listener, s.loop, s.image, s.force_listen, s.recording = None, None, None, False, None
        s.turn = "free"
        s.inbox.reset()  # the next session's stream starts at position 0
        self._publish_admission()  # the slot's memory is back before the pool hears of the free slot
        confirmations, s.pending_close = s.pending_close, []
        for confirm in confirmations:
            confirm()

    def _publish_admission(self) -> None:
        try:
            count = self.engine.admissible_sessions()
        except Exception:  # noqa: BLE001 - a failing estimate must not stop the tick; admit by slots alone
            logger.exception("engine.admissible_sessions failed")
            count = None
        opened = frozenset(s.index for s in self.slots if s.opened) if count is not None else frozenset()
        self.admission = (count, opened)

    def _retry_closes(self) -> None:
        for s in self.slots:
            if s.pending_close:
                self._close_now(s)

    def _cmd_freeze(self, s: WorkerSlot, frozen: bool) -> None:
        s.frozen = frozen
        if frozen:
            s.inbox.clear()  # a resumed slot starts from fresh audio, not from stale frames

    def _cmd_cancel(self, s: WorkerSlot) -> None:
        if s.opened and not s.failed:
            try:
                self.engine.cancel(s.index)
            except Exception as exc:  # noqa: BLE001
                logger.exception("engine.cancel(%d) failed", s.index)
                self._fail(s, f"cancel failed: {type(exc).__name__}: {exc}")

    def _cmd_force_listen(self, s: WorkerSlot) -> None:
        s.force_listen = True

    def _cmd_image(self, s: WorkerSlot, image: bytes) -> None:
        s.image = image

    def _cmd_chat(self, s: WorkerSlot, request: ChatRequest, listener: ChatListener, loop) -> None:
        self.chats.start(s.index, request, listener, loop)

    def _cmd_turn(self, s: WorkerSlot, turn: SlotTurn) -> None:
        s.turn = turn

    def _fail(self, s: WorkerSlot, message: str) -> None:
        s.failed = True
        self._post(s, "slot_failed", message)

    def _post(self, s: WorkerSlot, method: str, *args: Any) -> None:
        if s.listener is not None and s.loop is not None:
            if not post_to(s.loop, getattr(s.listener, method), *args):
                s.listener = None  # its loop is gone; nobody will read this slot again

    def _shutdown_slots(self) -> None:
        for s in self.slots:
            if s.opened:
                try:
                    self.engine.close_slot(s.index)
                except Exception:  # noqa: BLE001
                    logger.exception("engine.close_slot(%d) failed at shutdown", s.index)
                s.opened = False
