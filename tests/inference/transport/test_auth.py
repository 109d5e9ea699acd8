"""The inference service's handshake (inference/transport/auth.py) against real peers: other processes that
connect to a unix socket without the secret, with the wrong one, replaying the old token hello, reflecting
the service's own proof, or holding the right one; services that do not hold the secret, which must learn
nothing but a nonce; and the socket's private directory."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from inference.contracts import ParleyError
from inference.transport import auth, wire

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "s3cret-token-for-this-test"
# A second process: connects, plays one kind of peer, prints every frame the server answered.
PEER = """
import json, socket, struct, sys
from inference.transport import auth
path, mode, token = sys.argv[1:4]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(path)
def send(obj):
    body = json.dumps(obj).encode()
    sock.sendall(struct.pack(">IB", len(body) + 1, 1) + body)
def frame():
    header = sock.recv(5, socket.MSG_WAITALL)
    if len(header) < 5:
        return {}
    return json.loads(sock.recv(struct.unpack(">I", header[:4])[0] - 1, socket.MSG_WAITALL))
nonce = bytes(range(32))
if mode == "capabilities":
    send({"op": "capabilities"})
elif mode == "token-hello":  # the old handshake: the secret itself
    send({"op": "hello", "token": token})
elif mode == "no-nonce":
    send({"op": "hello"})
elif mode == "right":
    auth.client_handshake_sync(sock, token)
    print(json.dumps({"handshake": "done"}))
else:  # "proof": answers with a proof made from `token`; "reflect": sends the server's own proof back
    send({"op": "hello", "nonce": nonce.hex()})
    challenge = frame()
    print(json.dumps(challenge))
    if mode == "reflect":
        send({"op": "proof", "proof": challenge["proof"]})
    else:
        server_nonce = bytes.fromhex(challenge["nonce"])
        send({"op": "proof", "proof": auth.proof(token, b"client", nonce, server_nonce)})
while answer := frame():
    print(json.dumps(answer))
"""


async def serve(path: Path, token: str = TOKEN) -> asyncio.AbstractServer:
    async def handle(reader, writer):
        try:
            await auth.server_handshake(reader, writer, token)
        except auth.HandshakeRefused:
            writer.close()
            return
        writer.write(wire.json_frame({"served": True}))
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, path=str(path))


async def run_peer(path: Path, mode: str, token: str = TOKEN) -> list[dict]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PEER, str(path), mode, token, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


def refusals(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("inference.auth_refused")]


@pytest.mark.parametrize(
    ("mode", "token", "reason"),
    [
        ("capabilities", TOKEN, "not a hello"),
        ("token-hello", TOKEN, "carrying the token itself"),
        ("no-nonce", TOKEN, "malformed nonce"),
        ("proof", "wrong-token", "wrong proof"),
        ("reflect", TOKEN, "wrong proof"),  # the service's own answer, bounced back, is not the client's
    ],
)
async def test_a_peer_that_does_not_prove_the_secret_is_refused_and_logged(tmp_path, caplog, mode, token, reason):
    path = tmp_path / "run" / "t.sock"
    auth.private_socket_dir(path.parent)
    server = await serve(path)
    with caplog.at_level(logging.WARNING, logger="inference.transport.auth"):
        answers = await run_peer(path, mode, token)
    server.close()
    assert answers[-1]["error"]["code"] == "unauthenticated" and not any(a.get("served") for a in answers)
    (refused,) = refusals(caplog)
    assert reason in refused.reason
    assert TOKEN not in caplog.text and "wrong-token" not in caplog.text
    assert refused.peer_uid == os.geteuid() and refused.peer_pid > 0  # SO_PEERCRED named the process


async def test_the_right_secret_is_welcomed_and_served_without_ever_being_sent(tmp_path):
    path = tmp_path / "t.sock"
    server = await serve(path)
    answers = await run_peer(path, "right")
    server.close()
    assert answers == [{"handshake": "done"}, {"served": True}]


async def test_a_silent_peer_is_dropped_after_the_handshake_timeout(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(auth, "HANDSHAKE_TIMEOUT_S", 0.3)
    path = tmp_path / "t.sock"
    server = await serve(path)
    reader, writer = await asyncio.open_unix_connection(str(path))
    with caplog.at_level(logging.WARNING, logger="inference.transport.auth"):  # whatever logging set up before
        item = await asyncio.wait_for(wire.read_frame(reader), 5)
    assert item is not None and b"unauthenticated" in item[1]
    assert "handshake not finished within" in caplog.text
    writer.close()
    server.close()


class Impostor:
    """A unix listener that does not hold the secret: it keeps every byte a client sends and answers the
    hello as ``answer`` says: "welcome" (the old handshake's ok), "challenge" (a challenge with a proof made
    from a wrong secret) or "echo" (the client's own nonce and a garbage proof)."""

    def __init__(self, answer: str):
        self.answer = answer
        self.received = bytearray()

    async def handle(self, reader, writer):
        try:
            while item := await wire.read_frame(reader):
                self.received += wire.frame(*item)
                writer.write(wire.json_frame(self._reply(wire.parse_json(item[1]))))
                await writer.drain()
        except ConnectionError:
            pass  # the client hung up on us: what it sent is in self.received
        writer.close()

    def _reply(self, hello: dict) -> dict:
        if self.answer == "welcome":
            return {"reply": 0, "ok": True}
        nonce = bytes.fromhex(hello["nonce"])
        if self.answer == "echo":
            return {"op": "challenge", "nonce": nonce.hex(), "proof": "00"}
        mine = secrets.token_bytes(32)
        return {"op": "challenge", "nonce": mine.hex(), "proof": auth.proof("not-the-secret", b"server", nonce, mine)}


@pytest.mark.parametrize("answer", ["welcome", "challenge", "echo"])
async def test_a_service_without_the_secret_gets_only_a_nonce_and_the_client_says_why(tmp_path, caplog, answer):
    path, impostor = tmp_path / "t.sock", Impostor(answer)
    server = await asyncio.start_unix_server(impostor.handle, path=str(path))
    reader, writer = await asyncio.open_unix_connection(str(path))
    with caplog.at_level(logging.WARNING, logger="inference.transport.auth"), pytest.raises(ParleyError) as failed:
        await auth.client_handshake(reader, writer, TOKEN, peer="unix:///the/impostor")
    writer.close()
    # The blocking client (capabilities for pages) refuses the same way.
    with pytest.raises(ParleyError, match="did not prove"):
        await asyncio.to_thread(blocking_handshake, path)
    await asyncio.sleep(0.1)
    server.close()
    assert "did not prove" in failed.value.message and failed.value.code == "internal_error"
    assert "inference.service_unproven" in caplog.text and "unix:///the/impostor" in caplog.text
    frames = bytes(impostor.received)
    assert TOKEN.encode() not in frames
    (hello, other_hello) = split_frames(frames)  # one hello per connection, and not one frame more
    assert set(hello) == set(other_hello) == {"op", "nonce"} and hello["op"] == "hello"
    assert hello["nonce"] != other_hello["nonce"]  # fresh per connection


def blocking_handshake(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        auth.client_handshake_sync(sock, TOKEN, peer=f"unix://{path}")


def split_frames(data: bytes) -> list[dict]:
    frames = []
    while data:
        length = int.from_bytes(data[:4], "big")
        frames.append(json.loads(data[5 : 4 + length]))
        data = data[4 + length :]
    return frames


async def test_a_client_without_the_secret_cannot_complete_it_against_the_real_service(tmp_path, caplog):
    path = tmp_path / "t.sock"
    server = await serve(path)
    with caplog.at_level(logging.WARNING, logger="inference.transport.auth"):
        reader, writer = await asyncio.open_unix_connection(str(path))
        with pytest.raises(ParleyError, match="did not prove"):  # its wrong key cannot check the service's proof
            await auth.client_handshake(reader, writer, "not-" + TOKEN)
        writer.close()
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_unix_connection(str(path))
        with pytest.raises(ParleyError, match="PARLEY_INFERENCE_TOKEN is not set"):  # said before anything is sent
            await auth.client_handshake(reader, writer, None)
        writer.close()
        reader, writer = await asyncio.open_unix_connection(str(path))
        await auth.client_handshake(reader, writer, TOKEN)  # and with it, served
        assert wire.parse_json((await wire.read_frame(reader))[1]) == {"served": True}
        writer.close()
    server.close()
    assert any("closed before the proof" in r.reason for r in refusals(caplog))


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
