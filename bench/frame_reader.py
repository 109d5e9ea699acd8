"""What one caller's audio frame costs to parse: autobahn's frame machine against the inbound lane's frame reader.

Both read the same masked binary frames (80 ms of 24 kHz PCM16 and the frame's kind byte, as the call page sends
them) on autobahn's server protocol after a real opening handshake, one frame per ``dataReceived`` (as a socket
read brings them at 12.5 a second), into an ``onMessage`` that keeps nothing. Prints microseconds per frame, best
of ``--repeat``, and the ratio; writes ``bench/results/frame-reader-<hardware>-<commit>.json``.

    .venv/bin/python bench/frame_reader.py
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings.local")

import django  # noqa: E402

django.setup()

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol  # noqa: E402
from twisted.internet.testing import StringTransport  # noqa: E402

from bench.results_io import write_result  # noqa: E402
from webapp.conversations.frame_reader import BinaryFrameReader  # noqa: E402

HANDSHAKE = (
    b"GET /v1/realtime HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


class Quiet(WebSocketServerProtocol):
    def onMessage(self, payload, isBinary):
        pass


def opened(reader: bool) -> Quiet:
    protocol = Quiet()
    protocol.factory = WebSocketServerFactory()
    transport = StringTransport()
    protocol.makeConnection(transport)
    transport.registerProducer(protocol, True)
    protocol.dataReceived(HANDSHAKE)
    assert protocol.state == protocol.STATE_OPEN
    if reader:
        BinaryFrameReader.install(protocol)
    return protocol


def audio_frame(payload_bytes: int) -> bytes:
    payload = b"\x01" + os.urandom(payload_bytes - 1)
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return struct.pack("!BBH", 0x82, 0x80 | 126, len(payload)) + mask + masked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--payload-bytes", type=int, default=1 + 1920 * 2)
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    frame = audio_frame(args.payload_bytes)
    per_frame_us = {}
    for name, reader in (("autobahn", False), ("reader", True)):
        protocol = opened(reader)
        runs = timeit.repeat(lambda p=protocol: p.dataReceived(frame), number=args.frames, repeat=args.repeat)
        per_frame_us[name] = round(min(runs) / args.frames * 1e6, 2)
    ratio = round(per_frame_us["autobahn"] / per_frame_us["reader"], 2)
    print(f"per frame of {args.payload_bytes} bytes: autobahn {per_frame_us['autobahn']} us, "
          f"reader {per_frame_us['reader']} us ({ratio}x)")  # fmt: skip
    result = {"bench": "frame_reader", "frames": args.frames, "repeat": args.repeat,
              "payload_bytes": args.payload_bytes, "per_frame_us": per_frame_us, "autobahn_over_reader": ratio}  # fmt: skip
    print("wrote", write_result(result, "frame-reader", out=args.out_dir))


if __name__ == "__main__":
    main()
