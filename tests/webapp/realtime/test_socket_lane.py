"""The socket lane (``conversations.socket_lane``): a realtime socket's messages written straight to daphne's
transport.

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
from webapp.conversations.protocol import audio_frame
from webapp.conversations.socket_lane import FINAL_TEXT, SCOPE_KEY, SocketLane, frame_header

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
    protocol.client_addr = ["127.0.0.1", 1]  # daphne sets it in its handshake, which this skips
    transport.clear()  # nothing of a handshake was sent: only the frames below
    return protocol, transport


@pytest.mark.parametrize("length", PAYLOAD_LENGTHS)
def test_a_lane_frame_is_the_bytes_autobahn_writes_for_the_message(length):
    payload = bytes(np.random.default_rng(length).integers(0, 256, length, dtype=np.uint8))
    protocol, transport = open_autobahn_protocol()
    protocol.sendMessage(payload, isBinary=True)
    assert frame_header(length) + payload == transport.value()

    protocol, transport = open_autobahn_protocol()
    assert SocketLane(protocol).send_binary(payload)
    assert transport.value() == frame_header(length) + payload


@pytest.mark.parametrize("length", PAYLOAD_LENGTHS)
def test_a_lane_text_frame_is_the_bytes_daphne_and_autobahn_write_for_the_event(length):
    text = ("é" * length)[: max(length - length // 3, 0)]  # multi-byte UTF-8: the header counts bytes, not chars
    protocol, transport = open_autobahn_protocol()
    protocol.serverSend(text, binary=False)  # daphne's own path for a websocket.send with text
    expected = transport.value()
    assert expected == frame_header(len(text.encode()), FINAL_TEXT) + text.encode()

    protocol, transport = open_autobahn_protocol()
    assert SocketLane(protocol).send_text(text)
    assert transport.value() == expected


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
        lane = SocketLane(protocol)
        change(protocol)
        assert not lane.send_binary(b"\x01audio") and not lane.send_text("{}"), why
        assert transport.value() == b"", why


def test_no_lane_under_another_asgi_server():
    async def send(message):  # any other server's send: the ordinary path is used
        pass

    assert SocketLane.for_scope({SCOPE_KEY: send}) is None
    assert SocketLane.for_scope({}) is None


@pytest.mark.django_db(transaction=True)
def test_a_real_daphne_sends_a_calls_events_and_audio_through_the_lane(django_db_blocker):
    user = get_user_model().objects.create_user(username="lane-watcher", password="pw-for-tests-only", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_console"))
    key = apikey_create(user=user, name="socket lane")[1]
    signal = tone(FRAME * 6)
    with run_live_server(django_db_blocker, live_server_env("echo")) as server:
        before = messages_sent(server, key)  # the forked server starts with this test process's counts
        received, events = echo_call(server, key, signal)
        assert_echo(signal, received)
        after = messages_sent(server, key)
    assert {"session.created", "session.updated", "session.closed"} <= set(events)  # JSON, intact and in order
    lane, framework = (after[path] - before[path] for path in ("lane", "framework"))
    assert lane >= len(received) + len(events) and framework == 0, (before, after)


def echo_call(server: SimpleNamespace, key: str, signal: np.ndarray) -> tuple[list[bytes], list[str]]:
    """One binary-audio call to the echo engine: ``signal`` then silence, frame by frame, then ``session.close``.

    Returns the audio received and the types of the JSON events, in order.
    """
    pcm = to_pcm16(np.concatenate([signal, np.zeros(FRAME * 8, np.float32)]))
    frames = [pcm[i : i + FRAME * 2] for i in range(0, len(pcm), FRAME * 2)]
    received: list[bytes] = []
    events: list[str] = []
    headers = {"Authorization": f"Bearer {key}"}
    with connect(server.ws_url + "/v1/realtime?model=echo", additional_headers=headers, open_timeout=10) as ws:
        until(ws, "session.created", events)
        ws.send(json.dumps({"type": "session.update", "session": {"duplex": {"binary_audio": True}}}))
        until(ws, "session.updated", events)
        ws.send(audio_frame(bytes(FRAME * 2)))  # the slot opens at the first audio; its echo puts us on the clock
        next_audio(ws, events)
        for frame in frames:  # one frame out for each frame in: the pace of a microphone
            ws.send(audio_frame(frame))
            received.append(next_audio(ws, events))
        ws.send(json.dumps({"type": "session.close"}))
        until(ws, "session.closed", events)
    return received, events


def until(ws, event_type: str, events: list[str]) -> None:
    while True:
        message = ws.recv(timeout=10)
        if isinstance(message, str):
            events.append(json.loads(message)["type"])
            if events[-1] == event_type:
                return


def next_audio(ws, events: list[str]) -> bytes:
    while True:
        message = ws.recv(timeout=10)
        if isinstance(message, str):
            events.append(json.loads(message)["type"])
        else:
            assert message[0] == 0x01, f"unknown binary frame kind {message[0]}"
            return message[1:]


def messages_sent(server: SimpleNamespace, key: str) -> dict[str, float]:
    """``parley_socket_messages_sent_total`` by path, from the server's ``/ops/metrics``."""
    request = urllib.request.Request(server.url + "/ops/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        scrape = response.read().decode()
    pattern = r'^parley_socket_messages_sent_total\{path="(\w+)"\} (\S+)$'
    return {path: float(count) for path, count in re.findall(pattern, scrape, re.MULTILINE)}
