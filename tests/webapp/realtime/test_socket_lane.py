"""The socket lanes: a realtime socket's messages written straight to daphne's transport
(``conversations.socket_lane``), a live call's audio frames taken straight from daphne's protocol into its
session (``conversations.inbound_lane``), and its audio and text events taken straight from its session onto the
socket (``conversations.outbound_lane``).

The lane's frames must be byte for byte what autobahn writes for the same message, reach a real client through a
real daphne intact, and give way to the ordinary path whenever autobahn's own state says a direct write could
reorder or break the stream. The inbound lane must give the session what the ordinary path gives it, in the order
the client sent it, and leave every refusal to the ordinary path's answer. The outbound lane must send a session's
events in the order the session made them, never one past an event that is still on its way.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import struct
import urllib.request
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest
from autobahn.twisted.websocket import WebSocketServerFactory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from twisted.internet.testing import StringTransport
from websockets.sync.client import connect

from inference import api
from inference.contracts import AudioOut, Decision, Replaced, SessionEvent, TextOut
from inference.session.local_handle import LocalHandle
from inference.session.outbox import Outbox
from inference.transport import wire
from inference.transport.client import RemoteSessionHandle
from tests.live_server import live_server_env, run_live_server
from tests.webapp.realtime.realtime_helpers import FRAME, assert_echo, to_pcm16, tone
from webapp.accounts.services import apikey_create
from webapp.conversations.consumers import RealtimeConsumer
from webapp.conversations.inbound_lane import InboundLane
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
    received, events, before, after = counted_echo_call(django_db_blocker, "lane-watcher", messages_sent)
    assert {"session.created", "session.updated", "session.closed"} <= set(events)  # JSON, intact and in order
    lane, framework = (after[path] - before[path] for path in ("lane", "framework"))
    assert lane >= len(received) + len(events) and framework == 0, (before, after)


@pytest.mark.django_db(transaction=True)
def test_a_real_daphne_sends_a_paced_calls_audio_as_the_session_makes_it(django_db_blocker):
    received, events, before, after = counted_echo_call(django_db_blocker, "outbound-watcher", output_events)
    direct, queued = (after[path] - before[path] for path in ("direct", "queue"))
    assert direct + queued >= len(received) + 1, (before, after)  # and the priming frame's echo
    assert direct >= 0.8 * (direct + queued), (before, after)
    assert events[:2] == ["session.created", "session.updated"] and events[-1] == "session.closed", events
    assert events.count("session.created") == events.count("session.updated") == 1, events


def test_the_inbound_lane_gives_way_to_the_queue_and_to_what_the_session_declines():
    protocol, _ = open_autobahn_protocol()
    protocol.application_queue = asyncio.Queue()
    protocol.muted = False
    taken: list[bytes] = []
    answer = [True]
    lane = InboundLane(protocol, lambda frame: taken.append(frame) or answer[0])

    protocol.onMessage(b"\x01audio", True)
    assert taken == [b"\x01audio"] and protocol.application_queue.empty(), "a live call's frame goes straight in"
    protocol.onMessage(b'{"type": "session.close"}', False)
    protocol.onMessage(b"\x01behind a text event", True)
    assert taken == [b"\x01audio"], "nothing passes a message that waits on the queue"
    queued = [protocol.application_queue.get_nowait() for _ in range(2)]
    assert queued == [
        {"type": "websocket.receive", "text": '{"type": "session.close"}'},
        {"type": "websocket.receive", "bytes": b"\x01behind a text event"},
    ]
    answer[0] = False  # the session declines it (not ready, refused, its link behind): the ordinary path answers
    protocol.onMessage(b"\x01declined", True)
    assert protocol.application_queue.get_nowait() == {"type": "websocket.receive", "bytes": b"\x01declined"}
    protocol.muted = True  # daphne's muted socket hears nothing, by either path
    protocol.onMessage(b"\x01muted", True)
    assert protocol.application_queue.empty() and taken[-1] == b"\x01declined"

    lane.remove()
    assert InboundLane.install(SimpleNamespace(muted=False, last_ping=0.0, onMessage=print), bool) is None
    protocol.muted = False
    protocol.onMessage(b"\x01after", True)
    assert protocol.application_queue.get_nowait()["bytes"] == b"\x01after" and taken[-1] == b"\x01declined"
    assert "onMessage" not in vars(protocol), "the protocol keeps no reference to the consumer"


@pytest.mark.django_db(transaction=True)
def test_a_real_daphne_takes_a_calls_audio_frames_through_the_inbound_lane(django_db_blocker):
    _, _, before, after = counted_echo_call(django_db_blocker, "inbound-watcher", messages_received)
    lane, framework = (after[path] - before[path] for path in ("lane", "framework"))
    binary_frames_sent, text_events_sent = 1 + 14, 2  # the priming frame, the signal and its silence; update, close
    assert lane + framework == binary_frames_sent + text_events_sent, (before, after)
    assert lane >= binary_frames_sent - 1, "every frame sent while nothing else waited took the lane"


@pytest.mark.django_db(transaction=True)
def test_frames_sent_right_behind_a_format_change_are_read_in_the_new_format(django_db_blocker):
    """``session.update`` to float32 and the first float32 frame leave in one go: that frame must wait for the
    update on the queue, not pass it on the lane (as 16-bit samples it would be noise)."""
    key = console_key("format-changer")
    signal = tone(FRAME * 5)
    f32_frames = [f.tobytes() for f in np.split(np.concatenate([signal, np.zeros(FRAME * 8, np.float32)]), 13)]
    headers = {"Authorization": f"Bearer {key}"}
    events: list[dict] = []
    received: list[bytes] = []
    update = {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm-f32"}}}}}
    with run_live_server(django_db_blocker, live_server_env("echo")) as server:
        with connect(server.ws_url + "/v1/realtime?model=echo", additional_headers=headers, open_timeout=10) as ws:
            until(ws, "session.created", events)
            ws.send(json.dumps({"type": "session.update", "session": {"duplex": {"binary_audio": True}}}))
            until(ws, "session.updated", events)
            ws.send(audio_frame(bytes(FRAME * 2)))  # 16-bit silence; its echo puts this client on the clock
            next_audio(ws, events)
            ws.send(json.dumps(update))
            for frame in f32_frames:
                ws.send(audio_frame(frame))
                received.append(next_audio(ws, events))
            ws.send(audio_frame(b"\x00" * 7))  # a partial float32 sample: refused, with an error, by the queue's path
            refusal = json.loads(until_error(ws))
            ws.send(audio_frame(bytes(FRAME * 4)))
            next_audio(ws, events)  # and the call goes on
    assert types_and_order(events).count("session.updated") == 2
    assert_echo(signal, received)
    assert refusal["error"]["code"] == "invalid_audio", refusal


def test_an_outbox_offers_an_event_to_the_lane_only_while_nothing_is_queued():
    offered: list[SessionEvent] = []
    answer = [True]
    outbox = Outbox(max_audio=4)
    outbox.direct = lambda event: offered.append(event) or answer[0]
    first, second, third = AudioOut(b"\x01\x00", 0), TextOut("hi", 0), AudioOut(b"\x02\x00", 0)

    outbox.put(first)
    assert offered == [first] and len(outbox) == 0, "taken: not queued"
    answer[0] = False  # the lane declines (the pump is busy, the socket is not in its plain state): queued
    outbox.put(second)
    assert offered == [first, second] and len(outbox) == 1
    answer[0] = True
    outbox.put(third)
    assert offered == [first, second], "an event is never offered past one that waits in the queue"
    assert [outbox.take(), outbox.take(), outbox.take()] == [second, third, None]

    outbox.direct = None  # removed: everything queues
    outbox.put(first)
    assert outbox.take() == first and offered == [first, second]


def test_a_link_handle_offers_an_event_to_the_lane_only_while_nothing_is_queued():
    handle = RemoteSessionHandle(SimpleNamespace(attach=lambda h: 1))  # the link's side only: no service

    def from_the_link(event: SessionEvent) -> None:
        data = wire.event_frame(event)
        handle.on_frame(data[4], data[5:])  # as the link hands it over: the kind, then the payload

    offered: list[SessionEvent] = []
    answer = [True]
    handle.send_events_directly(lambda event: offered.append(event) or answer[0])
    first, second, third = AudioOut(b"\x01\x00", 3), TextOut("hi", 3), AudioOut(b"\x02\x00", 3)
    from_the_link(first)
    assert offered == [first] and handle._events.empty()
    answer[0] = False
    from_the_link(second)
    answer[0] = True
    from_the_link(third)
    assert offered == [first, second]
    assert [handle._events.get_nowait(), handle._events.get_nowait()] == [second, third]
    handle.on_frame(wire.JSON, json.dumps({"reply": 99, "ok": None}).encode())  # a reply is never offered
    handle.send_events_directly(None)
    from_the_link(first)
    assert handle._events.get_nowait() == first and offered == [first, second]


def messages_written(data: bytes) -> list[dict | bytes]:
    """The messages in a server's unmasked frames (RFC 6455 5.2): a text one as its JSON, a binary one as is."""
    messages: list[dict | bytes] = []
    at = 0
    while at < len(data):
        first, length = data[at], data[at + 1] & 0x7F
        at += 2
        if length == 126:
            (length,) = struct.unpack_from("!H", data, at)
            at += 2
        elif length == 127:
            (length,) = struct.unpack_from("!Q", data, at)
            at += 8
        payload = data[at : at + length]
        at += length
        messages.append(json.loads(payload) if first == FINAL_TEXT else payload)
    return messages


async def consumer_on_a_lane(monkeypatch) -> tuple[RealtimeConsumer, LocalHandle, object, StringTransport]:
    """A consumer connected over daphne's own protocol (on a test transport) to a bare in-process handle: what is
    put into the handle's outbox reaches the transport through the pump or the outbound lane."""
    protocol, transport = open_autobahn_protocol()
    handle = LocalHandle(SimpleNamespace(detach=lambda h: None), max_audio=50)  # type: ignore[arg-type]

    async def open_session(request):
        return handle

    async def base_send(message):
        assert message["type"] != "websocket.send", "every message takes the lane"

    monkeypatch.setattr(api, "open_session", open_session)
    consumer = RealtimeConsumer()
    consumer.scope = {
        "type": "websocket",
        "user": SimpleNamespace(pk=1, is_authenticated=True),
        SCOPE_KEY: functools.partial(print, protocol),  # daphne's send: partial(server.handle_reply, protocol)
    }
    consumer.channel_layer, consumer.base_send = None, base_send
    await consumer.connect()
    await settle()
    assert consumer.outbound is not None and consumer.pump_waiting and handle.outbox.direct is not None
    return consumer, handle, protocol, transport


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def types_and_order(messages: list[dict | bytes]) -> list[str]:
    """The types of the JSON events, after checking that they came in ``server_event_seq`` order, none missing."""
    seqs = [m["server_event_seq"] for m in messages if isinstance(m, dict)]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)) if seqs else []), seqs
    return [m["type"] for m in messages if isinstance(m, dict)]


async def test_a_calls_audio_goes_out_at_once_when_nothing_is_pending_and_never_past_what_is(monkeypatch):
    """An event is taken only while the handle's queue is empty, the pump is parked, no send is under way or waits
    for the lock, and no earlier event's rest is still going out. Cases 1, 2, 3 and 5 each fail with that check
    removed (the audio's events go out first); case 4 leaves the audio to the pump while autobahn must send."""
    consumer, handle, protocol, transport = await consumer_on_a_lane(monkeypatch)
    outbox = handle.outbox
    audio = AudioOut(b"\x01\x00" * 4, 0)

    outbox.put(audio)  # nothing pending: written in the callback that delivered it, no task woken
    assert len(outbox) == 0 and not consumer.sending
    assert types_and_order(messages_written(transport.value())) == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio.delta",
    ]
    transport.clear()

    # 1. An earlier event waits in the queue (the pump was woken for it, not run yet): the audio queues behind it.
    outbox.put(Decision("speak", 0, False))  # not the lane's: the pump sends it
    outbox.put(TextOut("hello", 0))
    outbox.put(audio)
    await settle()
    assert types_and_order(messages_written(transport.value())) == [
        "response.speak",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
    ]
    transport.clear()

    # 2. The pump is busy with an earlier event it has not sent yet (held here before it sends, as an awaited step
    # of its handling would: e.g. a client secret's configuration, applied before session.created).
    gate = asyncio.Event()
    handled = consumer._on_session_event

    async def slowly(event):
        if isinstance(event, Decision):
            await gate.wait()
        await handled(event)

    consumer._on_session_event = slowly
    outbox.put(Decision("listen", 1, True))
    await settle()
    assert len(outbox) == 0 and not consumer.pump_waiting, "the pump has taken it and is busy with it"
    outbox.put(audio)
    assert transport.value() == b"", "nothing passes the event the pump holds"
    gate.set()
    await settle()
    assert types_and_order(messages_written(transport.value())) == ["response.listen", "response.output_audio.delta"]
    transport.clear()
    consumer._on_session_event = handled

    # 3. Server events built earlier wait for the send lock (the lock just released, its waiter not yet run).
    await consumer.send_lock.acquire()
    waiting = asyncio.create_task(consumer._emit([consumer.events.event("input_audio_buffer.cleared")]))
    await settle()
    consumer.send_lock.release()
    outbox.put(audio)  # the lock is free, but its waiter holds an event stamped earlier
    await waiting
    await settle()
    assert types_and_order(messages_written(transport.value())) == [
        "input_audio_buffer.cleared",
        "response.output_audio.delta",
    ]
    transport.clear()

    # 4. autobahn must send (here: it has a write queued): the audio is left to the pump, as before the lane.
    protocol.send_queue.append((b"queued", False))
    outbox.put(audio)
    assert len(outbox) == 1, "queued for the pump"
    protocol.send_queue.clear()
    await settle()
    assert types_and_order(messages_written(transport.value())) == ["response.output_audio.delta"]
    transport.clear()

    # 5. A write refused midway (not expected: the lane was writable a moment before): the rest goes out in order,
    # through the ordinary send, and what comes meanwhile waits behind it.
    send, refusals = consumer.lane.send, iter([True, True, False])
    consumer.lane.send = lambda message: next(refusals, True) and send(message)
    next_epoch = AudioOut(b"\x02\x00" * 4, 1)  # the response ends and the next opens, then its audio
    outbox.put(next_epoch)
    outbox.put(next_epoch)
    await settle()
    consumer.lane.send = send
    assert types_and_order(messages_written(transport.value())) == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio.delta",
        "response.output_audio.delta",
    ]
    assert consumer.outbound.catching_up is None

    outbox.put(Replaced())  # the pump's last event: it lets go of the hook as it ends
    await consumer.pump
    assert outbox.direct is None and consumer.outbound is None, "nothing keeps a reference to the consumer"
    await consumer.disconnect(1000)


def until_error(ws) -> str:
    while True:
        message = ws.recv(timeout=10)
        if isinstance(message, str) and json.loads(message)["type"] == "error":
            return message


def console_key(username: str) -> str:
    """An API key whose user may read ``/ops/metrics``."""
    user = get_user_model().objects.create_user(username=username, password="pw-for-tests-only", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_console"))
    return apikey_create(user=user, name=username)[1]


def echo_call(server: SimpleNamespace, key: str, signal: np.ndarray) -> tuple[list[bytes], list[str]]:
    """One binary-audio call to the echo engine: ``signal`` then silence, frame by frame, then ``session.close``.

    Returns the audio received and the types of the JSON events, in order (checked to be whole and in order).
    """
    pcm = to_pcm16(np.concatenate([signal, np.zeros(FRAME * 8, np.float32)]))
    frames = [pcm[i : i + FRAME * 2] for i in range(0, len(pcm), FRAME * 2)]
    received: list[bytes] = []
    events: list[dict] = []
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
    return received, types_and_order(events)


def until(ws, event_type: str, events: list[dict]) -> None:
    while True:
        message = ws.recv(timeout=10)
        if isinstance(message, str):
            events.append(json.loads(message))
            if events[-1]["type"] == event_type:
                return


def next_audio(ws, events: list[dict]) -> bytes:
    while True:
        message = ws.recv(timeout=10)
        if isinstance(message, str):
            events.append(json.loads(message))
        else:
            assert message[0] == 0x01, f"unknown binary frame kind {message[0]}"
            return message[1:]


def counted_echo_call(
    django_db_blocker, username: str, count: Callable[[SimpleNamespace, str], dict[str, float]]
) -> tuple[list[bytes], list[str], dict[str, float], dict[str, float]]:
    """A paced echo call through a real daphne (``echo_call``, its echo checked), with the server's ``count`` read
    before and after it: the audio received, the JSON events' types, and the two counts."""
    key = console_key(username)
    signal = tone(FRAME * 6)
    with run_live_server(django_db_blocker, live_server_env("echo")) as server:
        before = count(server, key)  # the forked server starts with this test process's counts
        received, events = echo_call(server, key, signal)
        assert_echo(signal, received)
        after = count(server, key)
    return received, events, before, after


def frames_read(server: SimpleNamespace, key: str) -> dict[str, float]:
    """``parley_socket_frames_read_total`` by path, from the server's ``/ops/metrics``."""
    return by_path(server, key, "parley_socket_frames_read_total")


def messages_sent(server: SimpleNamespace, key: str) -> dict[str, float]:
    """``parley_socket_messages_sent_total`` by path, from the server's ``/ops/metrics``."""
    return by_path(server, key, "parley_socket_messages_sent_total")


def messages_received(server: SimpleNamespace, key: str) -> dict[str, float]:
    """``parley_socket_messages_received_total`` by path, from the server's ``/ops/metrics``."""
    return by_path(server, key, "parley_socket_messages_received_total")


def output_events(server: SimpleNamespace, key: str) -> dict[str, float]:
    """``parley_socket_output_events_total`` by path, from the server's ``/ops/metrics``."""
    return by_path(server, key, "parley_socket_output_events_total")


def by_path(server: SimpleNamespace, key: str, family: str) -> dict[str, float]:
    request = urllib.request.Request(server.url + "/ops/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        scrape = response.read().decode()
    pattern = rf'^{family}\{{path="(\w+)"\}} (\S+)$'
    return {path: float(count) for path, count in re.findall(pattern, scrape, re.MULTILINE)}
