"""The inbound lane's frame reader (``conversations.frame_reader``): a live call's binary frames parsed off the
socket's bytes in place of autobahn's frame machine.

Whatever bytes arrive, in whatever cuts, the protocol must hear the same messages in the same order, answer the
same (pongs, closes, failures for bad frames) and count the same traffic as with autobahn alone; and through a
real daphne a call's audio frames must take the reader.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.testing import StringTransport

from tests.webapp.realtime.test_socket_lane import counted_echo_call, frames_read
from webapp.conversations.frame_reader import BinaryFrameReader, unmask

HANDSHAKE = (
    b"GET /v1/realtime HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
TEXT, BINARY, CONTINUATION, CLOSE, PING = 0x1, 0x2, 0x0, 0x8, 0x9


class Recording(WebSocketServerProtocol):
    """autobahn's server protocol, keeping what it hears."""

    def onOpen(self):
        self.heard = []

    def onMessage(self, payload, isBinary):
        self.heard.append((isBinary, payload))


def opened(*, reader: bool, **options) -> tuple[Recording, StringTransport]:
    """A protocol after a real opening handshake on a test transport, with the reader in front or not."""
    factory = WebSocketServerFactory()
    factory.setProtocolOptions(**options)
    protocol = Recording()
    protocol.factory = factory
    transport = StringTransport()
    protocol.makeConnection(transport)
    transport.registerProducer(protocol, True)  # as Twisted's TCP transport has it: autobahn lets go on a failure
    protocol.dataReceived(HANDSHAKE)
    assert protocol.state == protocol.STATE_OPEN, transport.value()
    transport.clear()
    if reader:
        assert BinaryFrameReader.install(protocol) is not None
    return protocol, transport


def client_frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bytes | None = b"\x5a\x13\xc7\x00") -> bytes:
    """One client frame as RFC 6455 5.2 lays it out (masked unless ``mask`` is None)."""
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    bit = 0x80 if mask is not None else 0
    if n <= 125:
        head += bytes([bit | n])
    elif n <= 0xFFFF:
        head += struct.pack("!BH", bit | 126, n)
    else:
        head += struct.pack("!BQ", bit | 127, n)
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def stats(protocol) -> dict:
    return {k: v for k, v in vars(protocol.trafficStats).items() if k.startswith("incoming")}


def feed_both(chunks: list[bytes], **options) -> tuple[tuple, tuple]:
    """The same chunks to autobahn alone and to the reader in front: what each heard, wrote and counted."""
    outcomes = []
    for reader in (False, True):
        protocol, transport = opened(reader=reader, **options)
        for chunk in chunks:
            protocol.dataReceived(chunk)
        outcomes.append((protocol.heard, transport.value(), stats(protocol), protocol.state))
    return outcomes[0], outcomes[1]


def cuts(data: bytes, rng: np.random.Generator) -> list[bytes]:
    points = sorted(set(rng.integers(0, len(data) + 1, int(rng.integers(0, 6))).tolist()))
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]


def test_unmask_is_rfc_6455_masking_at_any_offset_and_length():
    rng = np.random.default_rng(7)
    for length in (0, 1, 3, 4, 5, 126, 3841, 65535):
        data = bytes(rng.integers(0, 256, length + 9, dtype=np.uint8))
        mask = bytes(rng.integers(0, 256, 4, dtype=np.uint8))
        expected = bytes(b ^ mask[i % 4] for i, b in enumerate(data[9:]))
        assert unmask(data, 9, length, mask) == expected


def test_audio_frames_back_to_back_take_the_reader_and_are_heard_as_autobahn_hears_them():
    payloads = [b"\x01" + os.urandom(n) for n in (125, 3840, 2560, 7680, 65534)]  # 16-bit lengths 126 .. 65 535
    data = b"".join(client_frame(BINARY, payload) for payload in payloads)
    plain, read = feed_both([data])
    assert read == plain and [payload for _, payload in read[0]] == payloads
    protocol, _ = opened(reader=True)
    autobahn_parse = []
    protocol.processData = lambda: autobahn_parse.append(1)  # autobahn's frame machine, if anything reaches it
    protocol.dataReceived(data)
    assert protocol.heard == [(True, payload) for payload in payloads] and not autobahn_parse


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param([client_frame(BINARY, b"\x01" + bytes(3840)), client_frame(TEXT, b'{"type":"x"}')], id="text"),
        pytest.param([client_frame(PING, b"hi"), client_frame(BINARY, b"\x01" + bytes(300))], id="ping-pong"),
        pytest.param([client_frame(BINARY, b"\x01" + bytes(100))], id="7-bit-length"),
        pytest.param([client_frame(BINARY, b"\x01" + bytes(70_000))], id="64-bit-length"),
        pytest.param(
            [client_frame(BINARY, b"\x01" + bytes(200), fin=False), client_frame(CONTINUATION, bytes(300))],
            id="fragmented",
        ),
        pytest.param(
            [client_frame(BINARY, b"\x01" + bytes(200), fin=False), client_frame(BINARY, b"\x01" + bytes(300))],
            id="a-new-message-inside-a-fragmented-one-is-a-violation",
        ),
        pytest.param([client_frame(BINARY, b"\x01" + bytes(300), mask=None)], id="unmasked-is-a-violation"),
        pytest.param([client_frame(BINARY | 0x40, b"\x01" + bytes(300))], id="rsv-bit-is-a-violation"),
        pytest.param(
            [client_frame(BINARY, b"\x01" + bytes(500)), client_frame(CLOSE, struct.pack("!H", 1000))], id="close"
        ),  # fmt: skip
    ],
)
def test_anything_but_a_plain_audio_frame_goes_to_autobahn_with_the_same_outcome(frames):
    frames = [*frames, client_frame(BINARY, b"\x01" + os.urandom(3840))]  # then a plain one, bytes to misread
    data = b"".join(frames)
    plain, read = feed_both([data])
    assert read == plain
    ends = range(1, len(data))
    boundaries = np.cumsum([len(frame) for frame in frames])[:-1].tolist()
    for cut in sorted({*ends[:40], *ends[-40:], *ends[::97], *boundaries}):  # cuts of the bytes across two reads
        autobahn_alone, with_reader = feed_both([data[:cut], data[cut:]])
        assert with_reader == autobahn_alone and with_reader[0] == plain[0], cut


def test_bytes_autobahn_holds_are_never_read_again_from_their_middle():
    """A frame whose header or payload autobahn holds in part: what follows the cut looks like an audio frame."""
    lookalike = bytes([0x82, 0xFE, 0x01, 0x00])  # an audio frame's header: 256 bytes follow its mask
    # a 16-bit length of 0x82FE and a mask beginning 01 00: from its third byte the header reads as one too
    header = bytes([0x82, 0xFE, 0x82, 0xFE, 0x01, 0x00, 0x33, 0x44])
    data = header + lookalike + os.urandom(0x82FE - len(lookalike))
    plain, _ = feed_both([data])
    assert len(plain[0]) == 1 and len(plain[0][0][1]) == 0x82FE
    for cut in range(1, 16):
        autobahn_alone, with_reader = feed_both([data[:cut], data[cut:]])
        assert with_reader == autobahn_alone == plain, cut

    # a ping (no message under way) whose payload reads as an audio frame's header running into the next frame
    ping = bytes([0x80 | PING, 0x80 | 125]) + bytes(4) + bytes([0x82, 0xFE, 0x00, 0x7E]) + os.urandom(121)
    data = ping + client_frame(BINARY, b"\x01" + os.urandom(3840))
    plain, _ = feed_both([data])
    for cut in range(1, 12):
        autobahn_alone, with_reader = feed_both([data[:cut], data[cut:]])
        assert with_reader == autobahn_alone == plain, cut


def test_a_frame_over_the_size_limit_fails_the_connection_as_autobahn_does():
    data = client_frame(BINARY, b"\x01" + bytes(4000))
    plain, read = feed_both([data], maxMessagePayloadSize=3000)
    assert read == plain and plain[0] == [] and plain[3] != Recording.STATE_OPEN


def test_a_server_that_does_not_unmask_is_left_to_autobahn():
    data = client_frame(BINARY, b"\x01" + os.urandom(3840))
    plain, read = feed_both([data], applyMask=False)
    assert read == plain and len(plain[0]) == 1


def test_random_streams_in_random_cuts_are_heard_counted_and_answered_as_autobahn_does():
    rng = np.random.default_rng(31)
    kinds = ("audio", "audio", "audio", "text", "ping", "small", "fragmented")
    for _ in range(150):
        frames = []
        for kind in rng.choice(kinds, int(rng.integers(1, 8))):
            payload = b"\x01" + bytes(rng.integers(0, 256, int(rng.integers(126, 4000)), dtype=np.uint8))
            if kind == "audio":
                frames.append(client_frame(BINARY, payload))
            elif kind == "text":
                frames.append(client_frame(TEXT, b'{"type":"input_audio_buffer.commit"}'))
            elif kind == "ping":
                frames.append(client_frame(PING, b"p"))
            elif kind == "small":
                frames.append(client_frame(BINARY, payload[:60]))
            else:
                frames += [client_frame(BINARY, payload, fin=False), client_frame(CONTINUATION, payload[:130])]
        data = b"".join(frames)
        chunks = cuts(data, rng)
        plain, read = feed_both(chunks)
        assert read == plain, chunks


def test_remove_gives_autobahn_its_reading_back():
    protocol, _ = opened(reader=True)
    reader = BinaryFrameReader.install(protocol)
    reader.remove()
    assert "dataReceived" not in vars(protocol)
    assert BinaryFrameReader.install(object()) is None, "not the autobahn it knows: autobahn reads everything"


@pytest.mark.django_db(transaction=True)
def test_a_real_daphne_reads_a_calls_audio_frames_with_the_reader(django_db_blocker):
    _, events, before, after = counted_echo_call(django_db_blocker, "reader-watcher", frames_read)
    assert {"session.created", "session.updated", "session.closed"} <= set(events)
    binary_frames_sent = 1 + 14  # the priming frame, the signal and its silence
    assert after["reader"] - before.get("reader", 0.0) == binary_frames_sent, (before, after)
