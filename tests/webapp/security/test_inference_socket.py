"""Finding 1: the inference service's socket. Real processes throughout: the service is
``python -m inference serve``; the intruder is a second Python process; the web tier is this one."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from inference import api
from inference.contracts import ParleyError, Ready, Replaced, SessionRequest, VoiceRef
from tests.inference.event_helpers import EventReader

ROOT = Path(__file__).resolve().parents[3]
# The intruder: connects, sends one call (optionally after answering the handshake's challenge with a proof
# made from the token it was given, without checking the service's proof), prints every frame it gets back.
INTRUDER = """
import json, os, socket, struct, sys
from inference.transport.auth import proof
path, token, op = sys.argv[1:4]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(10)
sock.connect(path)
def send(obj):
    body = json.dumps(obj).encode()
    try:
        sock.sendall(struct.pack(">IB", len(body) + 1, 1) + body)
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused after the proof: the answer is still there to read
if token != "-":
    nonce = os.urandom(32)
    send({"op": "hello", "nonce": nonce.hex()})
    header = sock.recv(5, socket.MSG_WAITALL)
    challenge = sock.recv(struct.unpack(">I", header[:4])[0] - 1, socket.MSG_WAITALL)
    print(challenge.decode())
    send({"op": "proof", "proof": proof(token, b"client", nonce, bytes.fromhex(json.loads(challenge)["nonce"]))})
if op == "open":
    send({"op": "open", "request": {"user_key": "victim"}})
else:
    send({"op": op})
data = b""
try:
    while chunk := sock.recv(65536):
        data += chunk
except (socket.timeout, ConnectionResetError):
    pass
while len(data) >= 5:
    (length,) = struct.unpack(">I", data[:4])
    print(data[5 : 4 + length].decode(errors="replace"))
    data = data[4 + length :]
"""


class Service:
    """A running ``python -m inference serve`` and everything it has logged so far."""

    def __init__(self, process: subprocess.Popen, socket_path: str, voices: Path):
        self.process, self.socket_path, self.voices = process, socket_path, voices
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def log_after(self, mark: int, needle: str, wait_s: float = 10.0) -> str:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            found = [line for line in self.lines[mark:] if needle in line]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"the service did not log {needle!r}:\n" + "".join(self.lines[-20:]))


def service_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    return {**env, "PYTHONPATH": str(ROOT), "PARLEY_ENGINE": "echo", "PARLEY_SLOTS": "2", **extra}


@pytest.fixture(scope="module")
def token():
    with pytest.MonkeyPatch.context() as patch:
        value = secrets.token_urlsafe(24)
        patch.setenv("PARLEY_INFERENCE_TOKEN", value)  # the web tier's side: this process
        yield value


@pytest.fixture(scope="module")
def service(token):
    folder = Path(tempfile.mkdtemp(prefix="parley-", dir="/tmp"))  # short socket path; mkdtemp is 0700
    socket_path, voices = str(folder / "run" / "inference.sock"), folder / "voices"
    voices.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "inference", "serve", "--socket", socket_path],
        cwd=ROOT,
        env=service_env(PARLEY_INFERENCE_TOKEN=token, PARLEY_VOICES_DIRS=str(voices)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    running = Service(process, socket_path, voices)
    running.log_after(0, "ready:", wait_s=120)
    assert oct(os.stat(Path(socket_path).parent).st_mode & 0o777) == "0o700"
    yield running
    process.terminate()
    process.wait(10)


@pytest.fixture
async def remote(service):
    await api.start(inference_url=f"unix://{service.socket_path}")
    yield service
    await api.shutdown()


def intrude(service: Service, token: str, op: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", INTRUDER, service.socket_path, token, op],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("op", ["occupancy", "open", "end_session", "capabilities"])
def test_a_process_without_the_token_is_refused_and_logged(service, op):
    mark = len(service.lines)
    answer = intrude(service, "-", op)
    assert '"unauthenticated"' in answer and '"ok"' not in answer and "victim" not in answer
    logged = service.log_after(mark, "inference.auth_refused")
    assert f"'{op}', not a hello" in logged and "uid=" in logged and "pid=" in logged


def test_a_process_with_a_wrong_token_is_refused_and_logged(service, token):
    mark = len(service.lines)
    answer = intrude(service, "not-" + token, "occupancy")
    assert '"unauthenticated"' in answer and "slots" not in answer
    logged = service.log_after(mark, "inference.auth_refused")
    assert "wrong proof" in logged and token not in "".join(service.lines)  # the token is never logged


def test_a_process_with_the_token_is_served(service, token):
    answer = intrude(service, token, "occupancy")
    assert '"challenge"' in answer.splitlines()[0] and '"ok":true' in answer.splitlines()[1]  # proved, welcomed
    assert '"num_slots":2' in answer  # then the call's reply


async def test_the_web_tier_works_and_an_intruder_cannot_take_over_a_live_session(remote):
    handle = await api.open_session(SessionRequest(user_key="victim"))
    events = EventReader(handle)
    assert isinstance(await events.until(Ready, within_s=10), Ready)
    mark = len(remote.lines)
    answer = await asyncio.to_thread(intrude, remote, "-", "open")  # the same user key as the victim
    assert '"unauthenticated"' in answer
    remote.log_after(mark, "inference.auth_refused")
    with pytest.raises(TimeoutError):  # the victim's handle was not replaced
        await events.until(Replaced, within_s=1.0)
    await handle.close()


async def test_voice_files_only_from_the_voices_storage(remote):
    outside = Path(tempfile.mkdtemp()) / "voice.wav"
    outside.write_bytes(b"RIFF")
    for path in (Path("/etc/passwd"), outside, remote.voices / ".." / "run" / "inference.sock"):
        with pytest.raises(ParleyError) as refused:
            await api.open_session(SessionRequest(user_key="mallory", voice=VoiceRef("v1", path)))
        assert refused.value.code == "voice_not_found"
    inside = remote.voices / "abc" / "voice.wav"
    inside.parent.mkdir(exist_ok=True)
    inside.write_bytes(b"RIFF")
    handle = await api.open_session(SessionRequest(user_key="carol", voice=VoiceRef("v2", inside)))
    assert isinstance(await EventReader(handle).until(Ready, within_s=10), Ready)
    with pytest.raises(ParleyError) as refused:  # and not by a later update either
        await handle.update(voice=VoiceRef("v3", Path("/etc/hostname")))
    assert refused.value.code == "voice_not_found"
    await handle.close()


@pytest.mark.parametrize(
    ("socket_dir", "token", "message"),
    [
        ("/tmp", "t0ken", "writable by others"),  # squattable: anyone may create files there
        (None, "", "PARLEY_INFERENCE_TOKEN is not set"),
    ],
)
def test_the_service_refuses_to_start_unsafely(socket_dir, token, message, tmp_path):
    folder = socket_dir or str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "inference", "serve", "--socket", f"{folder}/parley-{secrets.token_hex(4)}.sock"],
        cwd=ROOT,
        env=service_env(PARLEY_INFERENCE_TOKEN=token),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and message in result.stderr + result.stdout
