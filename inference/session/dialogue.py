"""DialogueSession: one user's persistent session, on the service's event loop.

A session outlives the connections that attach to it. Each connection gets a
``inference.session.local_handle.LocalHandle`` (the in-process ``SessionHandle``) with its own bounded outbox
of events; a new connection replaces the old handle, a dropped one detaches and starts the grace timer.

The session knows its collaborators only through the narrow interfaces of ``inference.session.context``
(one ``SessionContext`` per service): the engine worker as a ``SlotDriver``, the slot pool as an
``Admission``, and the service as a ``forget`` callback. It imports neither the service, the pool nor the
handle. What its Metrics say is ``inference.session.metrics``; its stream positions (the mouth-to-ear pair
in Metrics) are ``inference.session.stream_positions``. Collaborators own the rest: its recording
(``inference.session.recording.SessionRecorder``), its turn-based modes, half-duplex and chat
(``inference.turns.session_modes.TurnModes``, which sees the session as a ``ModesHost``), its engine
output on the way to the connection (``inference.session.tick_output.TickOutput``) and its once-a-second
housekeeping: idle watchdog, echo window, Metrics (``inference.session.housekeeping.Housekeeping``).

States: ``queued`` -> ``admitted`` (slot reserved) -> ``prefilling`` (slot opened at the first audio)
-> ``live`` -> ``closed``. Paused (by the user) and detached (no connection) are flags on top of
admitted/prefilling/live; either one freezes the slot in the engine.
"""

from __future__ import annotations

import logging
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Literal

import numpy as np

from inference import image_header
from inference.contracts import (
    Closed,
    CloseReason,
    ErrorEvent,
    Mode,
    ParleyError,
    Paused,
    Prefill,
    Queued,
    Ready,
    Replaced,
    Resumed,
    SessionEvent,
    VoiceRef,
)
from inference.engines.base import SlotConfig, SlotOutput, SlotTurn
from inference.session.context import Admission, Attachment, SessionContext, SessionTimeouts, SlotDriver
from inference.session.echo_watch import EchoWatch
from inference.session.housekeeping import Housekeeping
from inference.session.input_audio import InputAudio
from inference.session.named_timers import NamedTimers
from inference.session.output_jitter import OutputJitter
from inference.session.recording import SessionRecorder
from inference.session.stream_positions import StreamPositions
from inference.session.tick_output import TickOutput
from inference.turns.session_modes import TurnModes

logger = logging.getLogger(__name__)

__all__ = ["Admission", "Attachment", "DialogueSession", "SessionContext", "SessionTimeouts", "SlotDriver"]

State = Literal["queued", "admitted", "prefilling", "live", "closed"]


class DialogueSession:
    """One user's session: state, timers, audio framing, and the current connection.

    Args:
        context: the service's shared ``SessionContext``.
        user_key: the user this session belongs to.
        persona: persona text, fixed once audio starts.
        voice: voice reference, fixed once audio starts.
        record: the caller's wish to be recorded (the service's policy may override it), fixed once audio starts.
    """

    def __init__(
        self,
        context: SessionContext,
        user_key: str,
        persona: str | None,
        voice: VoiceRef | None,
        record: bool = True,
    ):
        self.recorder = SessionRecorder(context.recording, record)
        self.caps = context.capabilities
        self.loop = context.loop
        self._worker = context.worker
        self._admission = context.admission
        self._timeouts = context.timeouts
        self._forget = context.forget
        self.user_key = user_key
        self.session_id = "sess_" + uuid.uuid4().hex[:20]
        self.persona, self.voice = persona, voice
        self.state: State = "queued"
        self.slot: int | None = None
        self.user_paused = False
        self.attachment: Attachment | None = None
        self.audio_started = False
        self.epoch = 0
        self.created_at = time.monotonic()
        self.admitted_at: float | None = None
        self.last_activity = self.created_at
        self.input = InputAudio(self.caps.input_rate)
        self.dropped_out = 0  # outbound audio dropped by full outboxes
        self.played_ms = 0.0
        self._positions = StreamPositions(self.caps.input_rate)  # lets session.metrics name one tick exactly
        self.echo = EchoWatch(self.caps.input_rate, self.caps.output_rate)  # the caller's speakers into their mic?
        self._timers = NamedTimers(self.loop)
        # The collaborators see the session through a weak proxy, so that a call's session (its echo rings,
        # buffers and recorder, about 1 MB) is freed the moment the service lets go of it. Back-references made
        # each call a reference cycle, freed only by the interpreter's full collection, a minute or more apart
        # on a busy service: the service's RSS kept the peaks and rose with every call ended
        # (bench/notes/serving-e2e.md, the GPU soak at 7c2de23).
        host = weakref.proxy(self)
        self.modes = TurnModes(host, self.caps, self.loop, self._admission, self._worker, self.recorder)
        jitter_ms, jitter_s = context.test_output_jitter_ms, context.test_output_jitter_s
        jitter = OutputJitter(self.loop, jitter_ms, jitter_s) if jitter_ms > 0 else None
        self.output = TickOutput(
            self.caps.output_rate, self._positions, self.echo, lambda event: host.emit(event), self.modes, jitter
        )
        self._housekeeping = Housekeeping(
            host, self._worker, self._timers, self._timeouts, self._positions, self.output, self.caps.chunk_period_ms
        )

    # ---- connections --------------------------------------------------------------------------

    def attach(self, handle: Attachment, *, takeover: bool) -> None:
        """Make ``handle`` the session's connection; an older one gets Replaced and ends."""
        old, self.attachment = self.attachment, handle
        self._positions.attached()
        self.echo.attached()
        if old is not None:
            old.outbox.put(Replaced())
            self._retire(old)
        self._timers.cancel("grace")
        self.last_activity = time.monotonic()  # a (re)connection is activity for the idle watchdog
        if self.state == "queued":
            self._admission.tell_position(self)
            return
        if self.state == "closed":
            raise AssertionError("attach to a closed session")
        self.recorder.event("attach", takeover=takeover)
        handle.outbox.put(self._ready_event(resumed=takeover))
        if self.user_paused:
            handle.outbox.put(Paused())
        self._apply_freeze()
        self._housekeeping.schedule()

    def detach(self, handle: Attachment) -> None:
        """The connection dropped: keep the session paused for the grace period (queued: leave the queue)."""
        if handle is not self.attachment:  # replaced, or the session closed (and let go of its handle)
            return
        if self.state == "queued":
            self.close("client_close")
            return
        self._retire(handle)
        self.attachment = None
        self.recorder.event("detach")
        self._apply_freeze()
        self._timers.start("grace", self._timeouts.disconnect_grace_s, self.close, "grace_expired")

    def _retire(self, handle: Attachment) -> None:
        self.dropped_out += handle.outbox.dropped_audio
        handle.outbox.finish()

    # ---- pool callbacks -----------------------------------------------------------------------

    def admitted(self, slot: int | None) -> None:
        self.slot, self.state = slot, "admitted"
        self.admitted_at = time.monotonic()
        self._timers.start("max_duration", self._timeouts.max_session_s, self.close, "max_duration")
        if self.attachment is not None:
            self.attachment.outbox.put(self._ready_event(resumed=False))
            self._housekeeping.schedule()

    def queue_position(self, position: int, queue_length: int, estimated_wait_s: float) -> None:
        if self.attachment is not None:
            self.attachment.outbox.put(Queued(position, queue_length, estimated_wait_s))

    # ---- client requests (through the handle) -------------------------------------------------

    def update(
        self,
        *,
        persona: str | None,
        voice: VoiceRef | None,
        record: bool | None = None,
        record_video: bool | None = None,
    ) -> None:
        # The first audio fixes a call's recording, persona and voice; a chat's first message fixes its recording.
        # Keeping the camera frames is the caller's own choice at any time (recording.SessionRecorder.request_video).
        self.recorder.request_video(record_video)
        self.recorder.request(
            record, fixed_since="audio has started" if self.audio_started else "the chat's first message was added"
        )
        if self.audio_started:
            if persona is not None and persona != self.persona:
                raise ParleyError(
                    "the persona is fixed once audio has started", code="persona_update_unsupported", param="persona"
                )
            if voice is not None and (self.voice is None or voice.voice_id != self.voice.voice_id):
                raise ParleyError(
                    "the voice is fixed once audio has started", code="voice_update_unsupported", param="voice"
                )
            return
        if persona is not None:
            self.persona = persona
        if voice is not None:
            self.voice = voice

    def append_audio(self, data: bytes, encoding: str, rate: int) -> None:
        self.require_admitted()
        samples = self.input.samples(data, encoding, rate)
        self.last_activity = time.monotonic()
        if self.user_paused:
            self.input.dropped += 1  # the model clock is stopped; this audio has nowhere to go
            return
        self._positions.input_rate = rate
        if not self.audio_started:
            self.modes.check_streaming()
            self.audio_started = True
            self._open_slot()
        assert self.slot is not None
        if samples.size and self.modes.turns is not None:
            self.modes.turns.on_audio(samples)  # half-duplex: the VAD hears what the engine hears
        if samples.size:
            taken_whole = self._worker.push(self.slot, samples)
            self._positions.pushed += samples.size
            self.echo.caller(samples)
            if not taken_whole:
                self.input.overflowed()

    def append_image(self, data: bytes) -> None:
        if not self.caps.video:
            raise ParleyError(f"engine {self.caps.engine!r} takes no images", code="unsupported_input")
        if reason := image_header.refusal(data):  # from the header: nothing is decoded to find out
            raise ParleyError(reason, code="invalid_image", param="image")
        self.require_admitted()
        self.last_activity = time.monotonic()
        if self.audio_started and self.slot is not None:
            self._worker.set_image(self.slot, data)

    def pause(self) -> None:
        self.require_admitted()
        self.last_activity = time.monotonic()
        if not self.user_paused:
            self.user_paused = True
            self.recorder.event("pause")
            self._apply_freeze()
            self._timers.start("pause", self._timeouts.pause_timeout_s, self.close, "pause_timeout")
        self.emit(Paused())

    def resume(self) -> None:
        self.require_admitted()
        self.last_activity = time.monotonic()
        if self.user_paused:
            self.user_paused = False
            self.recorder.event("resume")
            self._timers.cancel("pause")
            self._apply_freeze()
        self.emit(Resumed())

    def cancel(self) -> None:
        self.require_admitted()
        self.epoch += 1
        # What the caller had not heard yet when the agent was cut off (from the last playback ack).
        self.recorder.event(
            "epoch", epoch=self.epoch, unplayed_ms=round(max(0.0, self.output.sent_audio_ms - self.played_ms), 1)
        )
        if self.attachment is not None:
            self.attachment.outbox.drop_epoch_before(self.epoch)
        if self.audio_started and self.slot is not None:
            self._worker.cancel(self.slot)
        self.modes.cancelled()

    def force_listen(self) -> None:
        if self.caps.family != "unit":
            raise ParleyError(f"engine {self.caps.engine!r} has no listen/speak units", code="unsupported_input")
        self.require_admitted()
        if self.audio_started and self.slot is not None:
            self._worker.force_listen(self.slot)

    def playback_ack(self, played_ms: float, heard: Sequence[tuple[int, int]] = ()) -> None:
        """``heard``: instants, each (input_samples, output_samples): where the page's microphone stream and the
        agent's audio it played stood (EchoWatch lines the two up with them)."""
        if not isinstance(played_ms, int | float) or not np.isfinite(played_ms) or played_ms < 0:
            raise ParleyError("played_ms must be a finite number >= 0", code="invalid_value", param="played_ms")
        self.played_ms = float(played_ms)
        for mic_at, played_at in heard:
            self.echo.ack(input_samples=mic_at, client_rate=self._positions.input_rate, output_samples=played_at)
        self.recorder.event("ack", played_ms=self.played_ms, sent_ms=round(self.output.sent_audio_ms, 1))

    def close(self, reason: CloseReason) -> None:
        """End the session: tell the connection, leave the queue or free the slot (once cleanup is confirmed)."""
        if self.state == "closed":
            return
        held_s = time.monotonic() - self.admitted_at if self.admitted_at is not None else 0.0
        self.state = "closed"
        self.output.cancel()
        self._timers.cancel_all()
        self.recorder.finish(reason)
        self.modes.closed()
        if self.attachment is not None:
            self.attachment.outbox.put(Closed(reason, nothing_recorded=self.recorder.recording is None))
            self._retire(self.attachment)
            # The handle holds the session and the session its handle: a cycle, unless one lets go. An in-process
            # caller's consumer never detaches after Closed, so every closed call (its echo rings and buffers,
            # ~0.3 MB) waited for the interpreter's full collection, hundreds of calls apart in a web process. A
            # detach that follows (the socket ends) finds no handle, so no grace timer holds the closed call either.
            self.attachment = None
        self._forget(self)
        self._admission.release(self, self.slot, held_s)
        logger.info("session.closed", extra={"session_id": self.session_id, "reason": reason})

    # ---- worker callbacks (on this loop) ------------------------------------------------------

    def slot_output(self, output: SlotOutput, pcm16: bytes, heard_position: int | None = None) -> None:
        if self.state == "closed":
            return
        if output.prefilling:
            self.state = "prefilling"
            self.emit(Prefill(progress=output.progress, done=False))
        elif self.state == "prefilling":
            self.state = "live"
            self.emit(Prefill(progress=1.0, done=True))
        self.output.send(output, pcm16, heard_position, self.epoch)

    def slot_failed(self, message: str) -> None:
        if self.state == "closed":
            return
        logger.error("session.engine_failed", extra={"session_id": self.session_id, "detail": message})
        self.emit(ErrorEvent("engine_failed", message, error_type="server_error"))
        self.close("engine_failed")

    # ---- turn-based modes: the handle takes a mode's requests (set_mode, add_chat_item, ...) to ``self.modes``

    def admit_for_chat(self) -> None:
        """Open a new session in chat mode (``SessionRequest.mode``): admitted at once, holding no slot."""
        self.state = "admitted"
        self.modes.start_in_chat()
        self.admitted(None)  # timers and Ready (mode chat), as an admission from the pool

    # ---- ModesHost: what the modes ask of the session ----------------------------------------------

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def give_back_slot(self) -> None:
        if self.slot is not None:  # the slot goes back to the pool until a response needs one
            self._admission.release(self, self.slot)
            self.slot = None

    def begin_recording(self) -> None:
        """At the first audio (or a chat's first message)."""
        voice = self.voice.voice_id if self.voice is not None else None
        self.recorder.begin(self.session_id, user_key=self.user_key, persona=self.persona, voice=voice)

    def set_turn(self, turn: SlotTurn) -> None:
        if self.audio_started and self.slot is not None and self.state != "closed":
            self._worker.set_turn(self.slot, turn)

    def next_epoch(self) -> int:
        """A new response's epoch: what the connection still holds of older ones is dropped."""
        self.epoch += 1
        self.recorder.event("epoch", epoch=self.epoch, response=True)
        if self.attachment is not None:
            self.attachment.outbox.drop_epoch_before(self.epoch)
        return self.epoch

    # ---- views --------------------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        return self.modes.mode

    @property
    def dropped_in(self) -> int:
        """Appends lost on the way in: inbox overflow and audio sent while paused."""
        return self.input.dropped

    @property
    def recorded(self) -> bool:
        """Recorded (or, before the first audio or chat message, going to be)."""
        return self.recorder.recorded

    @property
    def snapshot_state(self) -> str:
        if self.state == "closed":
            return "closing"
        if self.attachment is None:
            return "detached"
        if self.user_paused:
            return "paused"
        return "live" if self.state == "live" else "prefilling"

    # ---- internals ----------------------------------------------------------------------------

    def _ready_event(self, *, resumed: bool) -> Ready:
        return Ready(
            session_id=self.session_id,
            resumed=resumed,
            capabilities=self.caps,
            persona=self.persona,
            voice=self.voice.voice_id if self.voice is not None else None,
            recorded=self.recorded,
            mode=self.mode,
            turn_detection=self.modes.turn_detection_fields(),
        )

    def require_admitted(self) -> None:
        if self.state == "queued":
            raise ParleyError("the session is still queued for a slot", code="session_not_ready")
        if self.state == "closed":
            raise ParleyError("the session is closed", code="session_not_ready")

    def _open_slot(self) -> None:
        assert self.slot is not None
        self.state = "prefilling"
        config = SlotConfig(persona=self.persona, voice=self.voice)
        self.begin_recording()
        self._worker.open(self.slot, config, self, self.loop, self.recorder.recording)
        self.recorder.event("mode", mode=self.mode, turn_detection=self.modes.turn_detection_fields())  # for review
        if self.modes.turns is not None:
            self._worker.set_turn(self.slot, self.modes.turns.turn)
        self._apply_freeze()

    def _apply_freeze(self) -> None:
        if self.slot is not None and self.audio_started and self.state != "closed":
            self._worker.freeze(self.slot, self.user_paused or self.attachment is None)

    def emit(self, event: SessionEvent) -> None:
        """To the connection, if one is attached (the modes' events too)."""
        if self.attachment is not None:
            self.attachment.outbox.put(event)
