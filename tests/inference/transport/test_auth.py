"""The inference service's handshake (inference/transport/auth.py) against real peers: other processes
connecting to a unix socket without a token, with a wrong one, with the right one; and the socket's
private directory."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from inference.transport import auth, wire

TOKEN = "s3cret-token-for-this-test"
# A second process: connects, optionally says hello, prints what the server answered.
PEER = """
import json, socket, struct, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
first = sys.argv[2]
if first == "capabilities":
    body = json.dumps({"op": "capabilities"}).encode()
else:
    body = json.dumps({"op": "hello", **({"token": first} if first != "-" else {})}).encode()
sock.sendall(struct.pack(">IB", len(body) + 1, 1) + body)
data = b""
while chunk := sock.recv(65536):
    data += chunk
print(data[5:].decode(errors="replace"))
"""


async def serve(path: Path) -> asyncio.AbstractServer:
    async def handle(reader, writer):
        try:
            await auth.server_handshake(reader, writer, TOKEN)
        except auth.HandshakeRefused:
            writer.close()
            return
        writer.write(wire.json_frame({"served": True}))
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, path=str(path))


async def run_peer(path: Path, first: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PEER, str(path), first, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    return out.decode()


@pytest.mark.parametrize(
    ("first", "reason"),
    [("capabilities", "not a hello"), ("-", "no token"), ("wrong-token", "wrong token")],
)
async def test_a_peer_without_the_right_token_is_refused_and_logged(tmp_path, caplog, first, reason):
    path = tmp_path / "run" / "t.sock"
    auth.private_socket_dir(path.parent)
    server = await serve(path)
    with caplog.at_level(logging.WARNING, logger="inference.transport.auth"):
        answer = await run_peer(path, first)
    server.close()
    assert '"unauthenticated"' in answer and "served" not in answer
    refusals = [r for r in caplog.records if r.getMessage().startswith("inference.auth_refused")]
    assert len(refusals) == 1 and reason in refusals[0].reason
    assert TOKEN not in caplog.text and "wrong-token" not in caplog.text
    assert refusals[0].peer_uid == os.geteuid() and refusals[0].peer_pid > 0  # SO_PEERCRED named the process


async def test_the_right_token_is_welcomed_and_served(tmp_path):
    path = tmp_path / "t.sock"
    server = await serve(path)
    answer = await run_peer(path, TOKEN)
    server.close()
    assert '"ok":true' in answer and '"served":true' in answer


async def test_a_silent_peer_is_dropped_after_the_hello_timeout(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(auth, "HELLO_TIMEOUT_S", 0.3)
    path = tmp_path / "t.sock"
    server = await serve(path)
    reader, writer = await asyncio.open_unix_connection(str(path))
    with caplog.at_level(logging.WARNING, logger="inference.transport.auth"):  # whatever logging set up before
        item = await asyncio.wait_for(wire.read_frame(reader), 5)
    assert item is not None and b"unauthenticated" in item[1]
    assert "no hello within" in caplog.text
    writer.close()
    server.close()


async def test_client_handshake_raises_when_refused(tmp_path):
    path = tmp_path / "t.sock"
    server = await serve(path)
    reader, writer = await asyncio.open_unix_connection(str(path))
    with pytest.raises(auth.ParleyError, match="refused"):
        await auth.client_handshake(reader, writer, "not-it")
    writer.close()
    reader, writer = await asyncio.open_unix_connection(str(path))
    await auth.client_handshake(reader, writer, TOKEN)
    assert wire.parse_json((await wire.read_frame(reader))[1]) == {"served": True}
    writer.close()
    server.close()


def test_private_socket_dir_is_made_0700_and_a_shared_or_foreign_one_is_refused(tmp_path):
    made = auth.private_socket_dir(tmp_path / "a" / "run")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp itself
    with pytest.raises(PermissionError, match="writable by others"):
        auth.private_socket_dir(shared)
    if os.geteuid() == 0:  # CI and this machine run as root: make the directory another user's
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        with pytest.raises(PermissionError, match="belongs to uid 65534"):
            auth.private_socket_dir(foreign)
