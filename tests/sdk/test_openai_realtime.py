"""The official ``openai`` SDK's realtime client against the live server, with a Parley API key.

Sync client on purpose: the daphne live server runs in a child process, so this test needs no
event loop of its own (and may share a pytest run with other sync tests).
"""

import base64

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from openai import OpenAI

from webapp.accounts.services import apikey_create

pytestmark = pytest.mark.django_db(transaction=True)
FRAME = 1920  # 80 ms at 24 kHz


def pcm16(signal: np.ndarray) -> bytes:
    return (np.clip(signal, -1, 1) * 32767).round().astype("<i2").tobytes()


def next_of(connection, event_type: str, limit: int = 500):
    """The next event of ``event_type`` (parsed by the SDK), failing on errors."""
    for _ in range(limit):
        event = connection.recv()
        assert event.type != "error", event
        if event.type == event_type:
            return event
    raise AssertionError(f"no {event_type} within {limit} events")


def test_openai_sdk_session_update_audio_and_deltas(channels_live_server):
    user = get_user_model().objects.create_user(username="sdk-user", password="unused-password-1")
    _, key = apikey_create(user=user, name="sdk test")
    client = OpenAI(
        api_key=key, base_url=f"{channels_live_server.url}/v1", websocket_base_url=f"{channels_live_server.ws_url}/v1"
    )
    with client.realtime.connect(model="echo") as connection:
        created = next_of(connection, "session.created")
        assert created.session.id.startswith("sess_")

        connection.session.update(
            session={
                "type": "realtime",
                "instructions": "You are a helpful echo.",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}},
            }
        )
        updated = next_of(connection, "session.updated")
        assert updated.session.instructions == "You are a helpful echo."

        connection.input_audio_buffer.append(audio=base64.b64encode(pcm16(np.zeros(FRAME))).decode())
        first = next_of(connection, "response.output_audio.delta")
        assert len(base64.b64decode(first.delta)) == FRAME * 2  # pcm16 at 24 kHz, 80 ms

        # A tone comes back through the echo engine, intact, as SDK-parsed deltas.
        tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(FRAME * 3) / 24000)).astype(np.float32)
        connection.input_audio_buffer.append(audio=base64.b64encode(pcm16(tone)).decode())
        echoed = []
        for _ in range(40):
            delta = next_of(connection, "response.output_audio.delta")
            samples = np.frombuffer(base64.b64decode(delta.delta), "<i2").astype(np.float32) / 32767
            if echoed or np.abs(samples).max() > 1e-3:
                echoed.append(samples)
            if len(echoed) == 3:
                break
        np.testing.assert_allclose(np.concatenate(echoed), tone, atol=2e-4)

        connection.send({"type": "session.close"})
        assert next_of(connection, "session.closed").reason == "client_close"
