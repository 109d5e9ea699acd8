"""What an attacker with write access to the registry's Redis would run: a listener posing as an inference service.

``RogueService`` accepts TCP connections on a loopback port, keeps every byte each one sends, and
answers every JSON frame with a welcome (``{"reply": 0, "ok": true}``), the most a listener without
the shared secret can do to draw a client on: under the old handshake that drew out the hello with
``PARLEY_INFERENCE_TOKEN`` and then the caller's ``open`` request.
"""

from __future__ import annotations

import socket
import struct
import threading

from inference.transport import wire

_HEADER = struct.Struct(">IB")


class RogueService:
    """Start with ``with RogueService() as rogue:``; ``rogue.received`` and ``rogue.connections`` say what reached it."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port: int = self._server.getsockname()[1]
        self.connections = 0
        self.received = bytearray()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> RogueService:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        buffer = b""
        conn.settimeout(30)
        with conn:
            try:
                while chunk := conn.recv(65536):
                    with self._lock:
                        self.received += chunk
                    buffer += chunk
                    while len(buffer) >= _HEADER.size and len(buffer) >= 4 + (length := _HEADER.unpack_from(buffer)[0]):
                        buffer = buffer[4 + length :]
                        conn.sendall(wire.json_frame({"reply": 0, "ok": True}))  # "welcome": go on, send more
            except OSError:
                pass
