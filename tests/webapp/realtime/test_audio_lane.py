"""The audio lane (``conversations.audio_lane``): the agent's audio written straight to daphne's socket.

Its frames must be byte for byte what autobahn writes for the same message, reach a real client through a real
daphne intact, and give way to the ordinary path whenever autobahn's own state says a direct write could
reorder or break the stream.
"""

from __future__ import annotations

import json
import re
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
from autobahn.twisted.websocket import WebSocketServerFactory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from twisted.internet.testing import StringTransport
from websockets.sync.client import connect

from tests.live_server import live_server_env, run_live_server
from tests.webapp.realtime.realtime_helpers import FRAME, assert_echo, to_pcm16, tone
from webapp.accounts.services import apikey_create
from webapp.conversations.audio_lane import SCOPE_KEY, AudioLane, frame_header
from webapp.conversations.protocol import audio_frame

PAYLOAD_LENGTHS = (0, 1, 125, 126, 127, FRAME * 2 + 1, 0xFFFF, 0x10000, 70_001)


def open_autobahn_protocol() -> tuple[object, StringTransport]:
    """daphne's own protocol class on a Twisted test transport, in autobahn's open state."""
    from daphne.ws_protocol import WebSocketProtocol

    factory = WebSocketServerFactory()
    protocol = WebSocketProtocol()
    protocol.factory = factory
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.state = protocol.STATE_OPEN
    transport.clear()  # nothing of a handshake was sent: only the frames below
    return protocol, transport


@pytest.mark.parametrize("length", PAYLOAD_LENGTHS)
def test_a_lane_frame_is_the_bytes_autobahn_writes_for_the_message(length):
    payload = bytes(np.random.default_rng(length).integers(0, 256, length, dtype=np.uint8))
    protocol, transport = open_autobahn_protocol()
    protocol.sendMessage(payload, isBinary=True)
    assert frame_header(length) + payload == transport.value()

    protocol, transport = open_autobahn_protocol()
    assert AudioLane(protocol).send_binary(payload)
    assert transport.value() == frame_header(length) + payload


def test_the_lane_gives_way_whenever_autobahn_must_send_the_message_itself():
    cases = {
        "autobahn has queued writes (order)": lambda p: p.send_queue.append((b"queued", False)),
        "a message half sent": lambda p: setattr(p, "send_state", p.SEND_STATE_INSIDE_MESSAGE),
        "per-message compression": lambda p: setattr(p, "_perMessageCompress", object()),
        "the closing handshake began": lambda p: setattr(p, "state", p.STATE_CLOSING),
        "the connection is gone": lambda p: setattr(p, "state", p.STATE_CLOSED),
    }
    for why, change in cases.items():
        protocol, transport = open_autobahn_protocol()
        lane = AudioLane(protocol)
        change(protocol)
        assert not lane.send_binary(b"\x01audio"), why
        assert transport.value() == b"", why


def test_no_lane_under_another_asgi_server():
    async def send(message):  # any other server's send: the ordinary path is used
        pass

    assert AudioLane.for_scope({SCOPE_KEY: send}) is None
    assert AudioLane.for_scope({}) is None


@pytest.mark.django_db(transaction=True)
def test_a_real_daphne_sends_the_agents_audio_through_the_lane(django_db_blocker):
    user = get_user_model().objects.create_user(username="lane-watcher", password="pw-for-tests-only", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_console"))
    key = apikey_create(user=user, name="audio lane")[1]
    signal = tone(FRAME * 6)
    with run_live_server(django_db_blocker, live_server_env("echo")) as server:
        before = frames_sent(server, key)  # the forked server starts with this test process's counts
        received = echo_call(server, key, signal)
        assert_echo(signal, received)
        after = frames_sent(server, key)
    lane, framework = (after[path] - before[path] for path in ("lane", "framework"))
    assert lane >= len(received) and framework == 0, (before, after)


def echo_call(server: SimpleNamespace, key: str, signal: np.ndarray) -> list[bytes]:
    """One binary-audio call to the echo engine: ``signal`` then silence, frame by frame; the audio received."""
    pcm = to_pcm16(np.concatenate([signal, np.zeros(FRAME * 8, np.float32)]))
    frames = [pcm[i : i + FRAME * 2] for i in range(0, len(pcm), FRAME * 2)]
    received: list[bytes] = []
    headers = {"Authorization": f"Bearer {key}"}
    with connect(server.ws_url + "/v1/realtime?model=echo", additional_headers=headers, open_timeout=10) as ws:
        until(ws, "session.created")
        ws.send(json.dumps({"type": "session.update", "session": {"duplex": {"binary_audio": True}}}))
        until(ws, "session.updated")
        ws.send(audio_frame(bytes(FRAME * 2)))  # the slot opens at the first audio; its echo puts us on the clock
        next_audio(ws)
        for frame in frames:  # one frame out for each frame in: the pace of a microphone
            ws.send(audio_frame(frame))
            received.append(next_audio(ws))
    return received


def until(ws, event_type: str) -> dict:
    while True:
        message = ws.recv(timeout=10)
        if isinstance(message, str) and (event := json.loads(message))["type"] == event_type:
            return event


def next_audio(ws) -> bytes:
    while True:
        message = ws.recv(timeout=10)
        if isinstance(message, bytes):
            assert message[0] == 0x01, f"unknown binary frame kind {message[0]}"
            return message[1:]


def frames_sent(server: SimpleNamespace, key: str) -> dict[str, float]:
    """``parley_audio_frames_sent_total`` by path, from the server's ``/ops/metrics``."""
    request = urllib.request.Request(server.url + "/ops/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        scrape = response.read().decode()
    pattern = r'^parley_audio_frames_sent_total\{path="(\w+)"\} (\S+)$'
    return {path: float(count) for path, count in re.findall(pattern, scrape, re.MULTILINE)}
