"""The socket lane's writes sent to the socket at once (``conversations.socket_lane.write_now``).

A lane frame skips Twisted's buffer only when nothing of the connection is waiting in it, so the bytes a client
reads are the bytes written, in the order written, whatever the kernel takes: a write the kernel takes whole goes
at once, a part it does not take goes through the transport's buffer after the part it did, a connection with
bytes waiting keeps them first, and a socket error is left to the transport's own write. Through a real daphne, a
call's messages leave at once.
"""

from __future__ import annotations

import socket

import pytest

from tests.webapp.realtime.test_socket_lane import by_path, counted_echo_call
from webapp.conversations.socket_lane import write_now


class RecordingTransport:
    """The Twisted ``FileDescriptor`` state ``write_now`` reads, on a real socket; ``write`` records its bytes."""

    def __init__(self, sock: socket.socket):
        self.socket = sock
        self.TLS = False
        self.connected = True
        self.disconnecting = False
        self._writeDisconnected = False
        self.dataBuffer, self.offset = b"", 0
        self._tempDataBuffer: list[bytes] = []
        self.buffered: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.buffered.append(data)


def read_all(sock: socket.socket, length: int) -> bytes:
    chunks, got = [], 0
    while got < length:
        chunk = sock.recv(length - got)
        assert chunk, "the peer closed before the bytes came"
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    yield ours, theirs
    ours.close()
    theirs.close()


def test_a_write_the_kernel_takes_whole_goes_at_once(pair):
    ours, theirs = pair
    transport = RecordingTransport(ours)
    write_now(transport, b"\x82\x03abc")
    assert transport.buffered == []
    assert read_all(theirs, 5) == b"\x82\x03abc"


def test_what_the_kernel_does_not_take_follows_through_the_transports_buffer(pair):
    ours, theirs = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    data = bytes(range(256)) * 4096  # 1 MiB: far past any send buffer
    transport = RecordingTransport(ours)
    write_now(transport, data)
    assert len(transport.buffered) == 1 and 0 < len(transport.buffered[0]) < len(data)
    sent_at_once = len(data) - len(transport.buffered[0])
    assert read_all(theirs, sent_at_once) + transport.buffered[0] == data  # in order, none twice, none lost


@pytest.mark.parametrize("waiting", ["data_buffer", "temp_buffer", "disconnecting", "tls", "closed_for_writing"])
def test_bytes_already_waiting_or_a_closing_connection_keep_the_transports_order(pair, waiting):
    ours, theirs = pair
    transport = RecordingTransport(ours)
    if waiting == "data_buffer":
        transport.dataBuffer = b"earlier"
    elif waiting == "temp_buffer":
        transport._tempDataBuffer = [b"earlier"]
    elif waiting == "disconnecting":
        transport.disconnecting = True
    elif waiting == "tls":
        transport.TLS = True
    else:
        transport._writeDisconnected = True
    write_now(transport, b"later")
    assert transport.buffered == [b"later"]
    theirs.setblocking(False)
    with pytest.raises(BlockingIOError):
        theirs.recv(16)  # nothing went past the transport


def test_a_socket_error_is_left_to_the_transports_own_write(pair):
    ours, theirs = pair
    theirs.close()
    transport = RecordingTransport(ours)
    write_now(transport, b"x" * 100_000)  # the peer is gone: EPIPE or ECONNRESET on the first send
    assert transport.buffered == [b"x" * 100_000]


def test_a_transport_without_twisteds_state_is_written_through_its_own_write(pair):
    ours, _ = pair

    class Other:
        socket = ours
        buffered: list[bytes] = []

        def write(self, data):
            self.buffered.append(data)

    other = Other()
    write_now(other, b"frame")
    assert other.buffered == [b"frame"]


@pytest.mark.django_db(transaction=True)
def test_a_real_daphne_sends_a_calls_messages_at_once(django_db_blocker):
    received, events, before, after = counted_echo_call(django_db_blocker, "at-once-watcher", socket_writes)
    at_once, buffered = (after.get(path, 0) - before.get(path, 0) for path in ("at_once", "buffered"))
    assert at_once + buffered >= len(received) + len(events), (before, after)
    assert at_once >= 0.9 * (at_once + buffered), (before, after)  # a loopback client that reads keeps up


def socket_writes(server, key: str) -> dict[str, float]:
    """``parley_socket_writes_total`` by path, from the server's ``/ops/metrics``."""
    return by_path(server, key, "parley_socket_writes_total")
