"""Half-duplex on a unit engine: the caller's speech is cut into turns, and each committed turn is answered.

The slot is fed in real time as in a duplex call, but held to one side: every unit listens while the
caller has the turn, and responds once a turn is committed, until the model ends its turn or the
response reaches ``max_response_units``. Turns are committed by server VAD (``TurnDetection``) or by
the client (``input_audio_buffer.commit`` + ``response.create`` when ``turn_detection`` is null).
Speech during a response cancels it (barge-in), as OpenAI's ``interrupt_response`` does.

The controller lives on the session's event loop and talks to its session only through ``TurnHost``.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from inference.contracts import (
    TURN_DETECTION_LIMITS,
    ParleyError,
    ResponseEnded,
    ResponseStarted,
    SessionEvent,
    SpeechStarted,
    SpeechStopped,
    TurnCommitted,
    TurnDetection,
)
from inference.engines.base import SlotOutput, SlotTurn
from inference.turns.detector import SpeechStart, SpeechStop
from inference.turns.vad_thread import VadStream, vad_thread

MIN_COMMIT_MS = 100  # OpenAI refuses to commit less than 100 ms of audio
DEFAULT_MAX_RESPONSE_S = 30
MAX_RESPONSE_S_LIMIT = 600


class TurnHost(Protocol):
    """The session, as the controller drives it."""

    def emit(self, event: SessionEvent) -> None: ...
    def set_turn(self, turn: SlotTurn) -> None: ...
    def next_epoch(self) -> int:
        """A new output epoch for a response (older output is dropped)."""
        ...

    def cancel(self) -> None:
        """Barge-in: the session's cancel (epoch, worker), which then calls ``response_cancelled``."""
        ...


@dataclass
class _Response:
    epoch: int
    units: int = 0


def check_turn_detection(detection: TurnDetection | None) -> None:
    """``invalid_value`` for settings out of range (the web tier checks too; a socket peer may not)."""
    if detection is None:
        return
    for name, (low, high) in TURN_DETECTION_LIMITS.items():
        value = getattr(detection, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ParleyError(f"turn_detection.{name} must be a number", code="invalid_value", param=name)
        if not low <= value <= high:
            raise ParleyError(f"turn_detection.{name} must lie in [{low}, {high}]", code="invalid_value", param=name)


class HalfDuplex:
    """The turn state of one half-duplex session.

    Args:
        host: the session.
        loop: the session's event loop (VAD results come back on it).
        rate: the engine's input rate; the VAD runs at 16 kHz, which unit engines take natively.
    """

    def __init__(self, host: TurnHost, loop: asyncio.AbstractEventLoop, rate: int):
        if rate != 16_000:
            raise ParleyError("half-duplex needs a 16 kHz engine input", code="unsupported_mode")
        self._host, self._loop, self._rate = host, loop, rate
        self.detection: TurnDetection | None = TurnDetection()
        self.max_response_units = DEFAULT_MAX_RESPONSE_S
        self._stream: VadStream | None = None
        self._response: _Response | None = None
        self._uncommitted = 0  # samples since the last commit
        self.turn: SlotTurn = "listen"

    def configure(self, detection: TurnDetection | None, max_response_s: int | None = None) -> None:
        check_turn_detection(detection)
        if max_response_s is not None:
            if not 1 <= max_response_s <= MAX_RESPONSE_S_LIMIT:
                raise ParleyError(
                    f"max_response_s must lie in [1, {MAX_RESPONSE_S_LIMIT}]",
                    code="invalid_value",
                    param="max_response_s",
                )
            self.max_response_units = max_response_s  # one unit is one second
        if detection != self.detection and self._stream is not None:
            self._stream.closed = True  # new settings: a fresh detector from the next audio on
            self._stream = None
        self.detection = detection

    @property
    def responding(self) -> bool:
        return self._response is not None

    # ---- input -----------------------------------------------------------------------------------

    def on_audio(self, samples: np.ndarray) -> None:
        self._uncommitted += samples.size
        if self.detection is None:
            return
        if self._stream is None:
            self._stream = VadStream(self.detection, self._loop, self._on_vad)
        vad_thread().submit(self._stream, samples)

    def _on_vad(self, events: list[SpeechStart | SpeechStop]) -> None:
        detection = self.detection
        for event in events:
            if isinstance(event, SpeechStart):
                self._host.emit(SpeechStarted(event.audio_start_ms))
                if self._response is not None and detection is not None and detection.interrupt_response:
                    self._host.cancel()  # barge-in
            else:
                self._host.emit(SpeechStopped(event.audio_end_ms))
                self._commit()
                if detection is not None and detection.create_response and self._response is None:
                    self.create_response()

    def commit(self) -> None:
        """The client's ``input_audio_buffer.commit``."""
        if 1000 * self._uncommitted < MIN_COMMIT_MS * self._rate:
            raise ParleyError(
                f"buffer too small: at least {MIN_COMMIT_MS} ms of audio must be appended before a commit",
                code="input_audio_buffer_commit_empty",
            )
        self._commit()

    def _commit(self) -> None:
        self._uncommitted = 0
        self._host.emit(TurnCommitted())

    def clear(self) -> None:
        self._uncommitted = 0

    # ---- responses -------------------------------------------------------------------------------

    def create_response(self) -> None:
        if self._response is not None:
            raise ParleyError(
                "a response is already in progress; cancel it or wait for response.done",
                code="conversation_already_has_active_response",
            )
        self._response = _Response(epoch=self._host.next_epoch())
        self._set_turn("respond")
        self._host.emit(ResponseStarted(self._response.epoch))

    def on_output(self, output: SlotOutput) -> None:
        """One unit of the slot's output (already sent on); ends the response at its turn's end or its cap."""
        response = self._response
        if response is None or output.decision is None:
            return
        response.units += 1
        if output.end_of_turn:
            self._finish("completed")
        elif response.units >= self.max_response_units:
            self._finish("incomplete")  # the cap: the next (listen) unit closes the model's turn

    def response_cancelled(self) -> None:
        """``response.cancel`` or barge-in: the session already moved to a new epoch."""
        if self._response is not None:
            self._finish("cancelled")

    def _finish(self, status: str) -> None:
        response, self._response = self._response, None
        assert response is not None
        self._set_turn("listen")
        self._host.emit(ResponseEnded(response.epoch, status))  # type: ignore[arg-type]

    def _set_turn(self, turn: SlotTurn) -> None:
        self.turn = turn
        self._host.set_turn(turn)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.closed = True
