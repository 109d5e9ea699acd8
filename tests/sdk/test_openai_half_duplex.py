"""The stock ``openai`` SDK holds a half-duplex conversation with the unit engine (tiny MiniCPM-o checkpoint).

It sends espeak-ng speech followed by silence, in real time, and gets ``speech_started``, ``speech_stopped``,
``committed`` and a whole response (audio and transcript deltas, ``response.done``); speech during the
next response cancels it (barge-in). Bad turn settings and a second ``response.create`` get typed errors,
and the session goes on. This module starts its own daphne live server running the unit engine.
"""

from __future__ import annotations

import base64
import time

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from openai import OpenAI

from tests.live_server import run_unit_live_server
from tests.turn_audio import utterance
from webapp.accounts.services import apikey_create

pytestmark = pytest.mark.django_db(transaction=True)
RATE = 24_000
PIECE_S = 0.1


@pytest.fixture(scope="module")
def unit_server(tmp_path_factory, django_db_setup, django_db_blocker):
    with run_unit_live_server(tmp_path_factory, django_db_blocker, vocoder=False) as server:
        yield server


def pcm16(signal: np.ndarray) -> bytes:
    return (np.clip(signal, -1, 1) * 32767).round().astype("<i2").tobytes()


def send_real_time(connection, audio: np.ndarray) -> None:
    """Append ``audio`` in 100 ms pieces at the pace a microphone would."""
    step = int(PIECE_S * RATE)
    start = time.monotonic()
    for index, offset in enumerate(range(0, audio.size, step)):
        connection.input_audio_buffer.append(audio=base64.b64encode(pcm16(audio[offset : offset + step])).decode())
        time.sleep(max(0.0, start + (index + 1) * PIECE_S - time.monotonic()))


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * RATE), np.float32)


def collect_until(connection, event_type: str, limit: int = 2000, allow_errors: bool = False) -> list:
    """Events up to and including the next ``event_type``."""
    events = []
    for _ in range(limit):
        event = connection.recv()
        assert allow_errors or event.type != "error", event
        events.append(event)
        if event.type == event_type:
            return events
    raise AssertionError(f"no {event_type} within {limit} events")


def expect_error(connection, payload: dict, code: str) -> None:
    connection.send(payload)
    for _ in range(200):
        event = connection.recv()
        if event.type == "error":
            assert event.error.code == code, event
            return
    raise AssertionError(f"no error {code}")


def connect(server, username: str, client: OpenAI | None = None):
    client = client or sdk_client(server, username)
    # The first connection waits while the server loads and warms the model up.
    return client.realtime.connect(model="minicpmo", websocket_connection_options={"open_timeout": 180})


def sdk_client(server, username: str) -> OpenAI:
    user = get_user_model().objects.create_user(username=username, password="unused-password-1")
    _, key = apikey_create(user=user, name="sdk half-duplex")
    return OpenAI(api_key=key, base_url=f"{server.url}/v1", websocket_base_url=f"{server.ws_url}/v1")


def test_sdk_half_duplex_turns_responses_and_barge_in(unit_server):
    with connect(unit_server, "sdk-half-duplex") as connection:
        created = collect_until(connection, "session.created")[-1]
        assert "half_duplex" in created.session.model_dump()["duplex"]["capabilities"]["modes"]

        # Bad turn settings: typed errors, nothing changes, the session goes on.
        bad_vad = {"type": "server_vad", "threshold": 1.5}
        expect_error(connection, _update({"type": "bogus_vad"}), "invalid_value")
        expect_error(connection, _update(bad_vad), "invalid_value")
        expect_error(connection, _update({"type": "server_vad", "silence_duration_ms": -1}), "invalid_value")
        expect_error(connection, _update({"type": "semantic_vad"}), "unsupported_turn_detection")
        expect_error(
            connection, {"type": "session.update", "session": {"duplex": {"mode": "omni"}}}, "invalid_value"
        )  # chat is served now (tests/sdk/test_openai_chat.py); an unknown mode is refused

        connection.session.update(session=_update({"type": "server_vad"}, max_response_s=3)["session"])
        updated = collect_until(connection, "session.updated")[-1].session.model_dump()
        assert updated["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        assert updated["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 500
        assert updated["duplex"]["mode"] == "half_duplex"

        # The slot prepares and listens for its first units; then one utterance and silence after it.
        send_real_time(connection, silence(1.0))
        send_real_time(connection, np.concatenate([utterance("What is the weather like today?", RATE), silence(1.2)]))
        events = collect_until(connection, "response.done")
        types = [e.type for e in events]
        for expected in ("speech_started", "speech_stopped", "committed"):
            assert types.count(f"input_audio_buffer.{expected}") == 1, types
        order = [
            types.index(t)
            for t in (
                "input_audio_buffer.speech_started",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
                "response.created",
                "response.done",
            )
        ]
        assert order == sorted(order), types
        started = next(e for e in events if e.type == "input_audio_buffer.speech_started")
        stopped = next(e for e in events if e.type == "input_audio_buffer.speech_stopped")
        assert 1000 <= started.audio_start_ms < stopped.audio_end_ms
        done = events[-1]
        assert done.response.status in ("completed", "incomplete")  # the model's turn end, or max_response_s
        assert "response.output_audio.delta" in types and "response.output_audio_transcript.delta" in types
        response_id = done.response.id
        assert all(e.response_id == response_id for e in events if e.type == "response.output_audio.delta")

        # A second response.create while none runs starts one; a third while it runs is refused.
        connection.response.create()
        collect_until(connection, "response.created")
        expect_error(connection, {"type": "response.create"}, "conversation_already_has_active_response")

        # Barge-in: speech while that response runs cancels it.
        send_real_time(connection, utterance("Stop, wait a moment.", RATE))
        events = collect_until(connection, "response.done")
        types = [e.type for e in events]
        assert "input_audio_buffer.speech_started" in types
        assert events[-1].response.status == "cancelled", types

        connection.send({"type": "session.close"})
        assert collect_until(connection, "session.closed")[-1].reason == "client_close"


def test_manual_turns_commit_and_create_response(unit_server):
    """``turn_detection: null``: the client commits its turn and asks for the response itself."""
    with connect(unit_server, "sdk-manual-turns") as connection:
        collect_until(connection, "session.created")
        connection.send(_update(None, mode="half_duplex", max_response_s=2))
        updated = collect_until(connection, "session.updated")[-1].session.model_dump()
        assert updated["audio"]["input"]["turn_detection"] is None and updated["duplex"]["mode"] == "half_duplex"
        expect_error(connection, {"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty")
        send_real_time(connection, np.concatenate([silence(1.0), utterance("Hello there.", RATE), silence(1.0)]))
        connection.input_audio_buffer.commit()
        events = collect_until(connection, "input_audio_buffer.committed")
        assert not any(e.type == "input_audio_buffer.speech_started" for e in events), "no VAD without turn_detection"
        connection.response.create()
        events = collect_until(connection, "response.done")
        assert events[-1].response.status in ("completed", "incomplete")
        connection.send({"type": "session.close"})
        collect_until(connection, "session.closed")


def _update(turn_detection: dict | None, **duplex) -> dict:
    return {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": turn_detection}},
            **({"duplex": duplex} if duplex else {}),
        },
    }


def test_a_resumed_session_keeps_its_mode_and_turn_detection(unit_server):
    client = sdk_client(unit_server, "sdk-resume-turns")
    with connect(unit_server, "", client) as connection:
        collect_until(connection, "session.created")
        connection.send(_update({"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 700}))
        collect_until(connection, "session.updated")
        send_real_time(connection, silence(0.3))
    with connect(unit_server, "", client) as connection:  # within the disconnect grace: the same session
        created = collect_until(connection, "session.created")[-1]
        session = created.session.model_dump()
        assert session["duplex"]["resumed"] and session["duplex"]["mode"] == "half_duplex"
        detection = session["audio"]["input"]["turn_detection"]
        assert (detection["type"], detection["threshold"], detection["silence_duration_ms"]) == ("server_vad", 0.6, 700)
        connection.send({"type": "session.close"})
        collect_until(connection, "session.closed")
