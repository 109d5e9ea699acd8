"""HalfDuplex, the session-side turn controller, against a recording fake session (real Silero VAD, no engine)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from inference.contracts import (
    ParleyError,
    ResponseEnded,
    ResponseStarted,
    SpeechStarted,
    SpeechStopped,
    TurnCommitted,
    TurnDetection,
)
from inference.engines.base import SlotOutput
from inference.turns.half_duplex import HalfDuplex
from tests.turn_audio import utterance

RATE = 16_000


class FakeSession:
    """The TurnHost side: records what the controller emits and how it holds the slot."""

    def __init__(self) -> None:
        self.events: list = []
        self.turns: list[str] = []
        self.epoch = 0
        self.controller: HalfDuplex | None = None

    def emit(self, event) -> None:
        self.events.append(event)

    def set_turn(self, turn) -> None:
        self.turns.append(turn)

    def next_epoch(self) -> int:
        self.epoch += 1
        return self.epoch

    def cancel(self) -> None:  # as DialogueSession.cancel: a new epoch, then the controller hears of it
        self.epoch += 1
        assert self.controller is not None
        self.controller.response_cancelled()


def unit(*, end_of_turn: bool = False) -> SlotOutput:
    return SlotOutput(audio=np.zeros(0, np.float32), decision="speak", end_of_turn=end_of_turn)


async def feed(controller: HalfDuplex, audio: np.ndarray) -> None:
    for start in range(0, audio.size, RATE // 50):
        controller.on_audio(audio[start : start + RATE // 50])


async def until(session: FakeSession, kind: type, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not any(isinstance(e, kind) for e in session.events):
        assert asyncio.get_running_loop().time() < deadline, f"no {kind.__name__}: {session.events}"
        await asyncio.sleep(0.02)


def controller_for(session: FakeSession, detection: TurnDetection | None, max_response_s: int = 3) -> HalfDuplex:
    controller = HalfDuplex(session, asyncio.get_running_loop(), RATE)
    controller.configure(detection, max_response_s)
    session.controller = controller
    return controller


async def test_a_turn_is_committed_answered_and_ended_by_the_model():
    session = FakeSession()
    controller = controller_for(session, TurnDetection())
    speech = utterance("What time is it?")
    await feed(controller, np.concatenate([np.zeros(RATE // 2, np.float32), speech, np.zeros(RATE, np.float32)]))
    await until(session, ResponseStarted)
    kinds = [type(e) for e in session.events]
    assert kinds == [SpeechStarted, SpeechStopped, TurnCommitted, ResponseStarted]
    assert session.turns == ["respond"] and controller.responding
    controller.on_output(unit())
    controller.on_output(unit(end_of_turn=True))
    assert session.events[-1] == ResponseEnded(epoch=1, status="completed")
    assert session.turns == ["respond", "listen"] and not controller.responding
    controller.close()


async def test_speech_during_a_response_cancels_it_and_the_cap_ends_a_long_one():
    session = FakeSession()
    controller = controller_for(session, TurnDetection(), max_response_s=2)
    controller.create_response()
    with pytest.raises(ParleyError) as busy:
        controller.create_response()
    assert busy.value.code == "conversation_already_has_active_response"
    await feed(controller, np.concatenate([np.zeros(RATE // 4, np.float32), utterance("Wait!")]))
    await until(session, ResponseEnded)
    assert session.events[:2] == [ResponseStarted(1), SpeechStarted(session.events[1].audio_start_ms)]
    assert session.events[2] == ResponseEnded(epoch=1, status="cancelled")
    await feed(controller, np.zeros(RATE, np.float32))  # the turn ends: a new response, capped at 2 units
    await until(session, TurnCommitted)
    deadline = asyncio.get_running_loop().time() + 10
    while not controller.responding:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    controller.on_output(unit())
    controller.on_output(unit())
    assert session.events[-1].status == "incomplete" and not controller.responding
    controller.close()


async def test_manual_turns_commit_only_real_audio_and_run_no_vad():
    session = FakeSession()
    controller = controller_for(session, None)
    with pytest.raises(ParleyError) as empty:
        controller.commit()
    assert empty.value.code == "input_audio_buffer_commit_empty"
    await feed(controller, np.concatenate([utterance("Hello there."), np.zeros(RATE, np.float32)]))
    await asyncio.sleep(0.5)
    assert session.events == []  # no server VAD
    controller.commit()
    controller.create_response()
    assert [type(e) for e in session.events] == [TurnCommitted, ResponseStarted]


@pytest.mark.parametrize(
    "detection",
    [
        TurnDetection(threshold=1.5),
        TurnDetection(prefix_padding_ms=-1),
        TurnDetection(silence_duration_ms=float("nan")),
    ],
)
async def test_out_of_range_settings_from_a_socket_peer_are_refused(detection):
    controller = controller_for(FakeSession(), TurnDetection())
    with pytest.raises(ParleyError) as bad:
        controller.configure(detection)
    assert bad.value.code == "invalid_value"
    assert controller.detection == TurnDetection()  # nothing changed
