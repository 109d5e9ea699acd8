"""Helpers for the realtime consumer tests: users, keys, connections and event readers.

Imported by the test modules next to it (pytest puts this folder on sys.path).
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from webapp.accounts.services import apikey_create
from webapp.asgi import application

FRAME = 1920  # 80 ms at 24 kHz: the echo engine's chunk
ALLOWED_ORIGIN = b"http://127.0.0.1:8000"


def tone(samples: int, *, freq: float = 440.0, rate: int = 24_000, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(samples) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def to_pcm16(signal: np.ndarray) -> bytes:
    return (np.clip(signal, -1, 1) * 32767).round().astype("<i2").tobytes()


def from_pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass
class Account:
    user: Any
    key: str


@database_sync_to_async
def make_account(username: str = "alice") -> Account:
    user = get_user_model().objects.create_user(username=username, password="pw-for-tests-only")
    _, key = apikey_create(user=user, name="test")
    return Account(user=user, key=key)


@database_sync_to_async
def session_cookie_for(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


@dataclass
class Peer:
    """One WebSocket connection with a reader that keeps every event it has seen."""

    comm: WebsocketCommunicator
    seen: list[Any] = field(default_factory=list)

    async def send(self, event: dict[str, Any]) -> None:
        await self.comm.send_to(text_data=json.dumps(event))

    async def send_raw(self, text: str | None = None, data: bytes | None = None) -> None:
        await self.comm.send_to(text_data=text, bytes_data=data)

    async def next(self, wait_s: float = 5.0) -> Any:
        """The next event (a dict), a binary frame (bytes), or ("closed", code)."""
        message = await self.comm.receive_output(wait_s)
        if message["type"] == "websocket.close":
            item: Any = ("closed", message.get("code"))
        elif message.get("text") is not None:
            item = json.loads(message["text"])
        else:
            item = message["bytes"]
        self.seen.append(item)
        return item

    async def until(self, event_type: str, wait_s: float = 5.0) -> dict[str, Any]:
        """Read until an event of ``event_type`` (a close counts as type "closed")."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            item = await self.next(max(0.05, deadline - loop.time()))
            if isinstance(item, dict) and item.get("type") == event_type:
                return item
            if isinstance(item, tuple) and event_type == "closed":
                return {"type": "closed", "code": item[1]}
            if isinstance(item, tuple):
                raise AssertionError(f"socket closed with {item[1]} while waiting for {event_type}")

    async def error(self, wait_s: float = 5.0) -> dict[str, Any]:
        return (await self.until("error", wait_s))["error"]

    async def audio_frames(self, count: int, wait_s: float = 10.0) -> list[bytes]:
        """The pcm16 payloads of the next ``count`` audio deltas (base64 or binary)."""
        frames: list[bytes] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while len(frames) < count:
            item = await self.next(max(0.05, deadline - loop.time()))
            if isinstance(item, bytes):
                assert item[0] == 0x01, item[:1]
                frames.append(item[1:])
            elif isinstance(item, dict) and item["type"] == "response.output_audio.delta":
                frames.append(base64.b64decode(item["delta"]))
            elif isinstance(item, tuple):
                raise AssertionError(f"socket closed with {item[1]} after {len(frames)} audio frames")
        return frames

    async def close(self) -> None:
        await self.comm.disconnect()

    async def append(self, payload: bytes, *, binary: bool = False) -> None:
        if binary:
            await self.send_raw(data=b"\x01" + payload)
        else:
            await self.send({"type": "input_audio_buffer.append", "audio": b64(payload)})

    async def stream(
        self,
        payload: bytes,
        *,
        chunk_bytes: int,
        frame_bytes: int = FRAME * 2,
        binary: bool = False,
        tail: int = 6,
        lead: int = 2,
    ) -> list[bytes]:
        """Send ``payload`` in appends of ``chunk_bytes`` at the engine's pace; returns the audio received.

        The engine ticks in real time; reading one output frame per engine frame sent (``frame_bytes``
        of input) keeps the session's bounded inbox from overflowing or running dry, like a real
        client streaming its microphone. ``lead`` frames are kept queued so that a busy test machine
        does not starve the engine clock (it would insert silence into the echo); a queue that
        stands for about a second is trimmed by the worker, so long streams need ``lead=0``.
        """
        frames: list[bytes] = []
        sent = 0
        for start in range(0, len(payload), chunk_bytes):
            piece = payload[start : start + chunk_bytes]
            await self.append(piece, binary=binary)
            sent += len(piece)
            behind = sent // frame_bytes - lead - len(frames)
            if behind > 0:
                frames += await self.audio_frames(behind)
        return frames + await self.audio_frames(tail + min(lead, sent // frame_bytes))

    async def prime(self, payload: bytes | None = None, *, binary: bool = False) -> None:
        """Start the session's audio with one chunk (default: 80 ms of 24 kHz pcm16 silence) and wait for output.

        The slot opens at the first audio; priming puts the echo of what follows on the steady clock.
        """
        await self.append(payload if payload is not None else bytes(FRAME * 2), binary=binary)
        await self.audio_frames(1)

    async def proves_alive(self) -> None:
        """The session still works: a tone goes in and comes back from the echo engine."""
        await self.prime()
        signal = tone(FRAME * 2)
        frames = await self.stream(to_pcm16(signal), chunk_bytes=FRAME * 2)
        assert_echo(signal, frames)


def assert_echo(sent: np.ndarray, received: list[bytes]) -> None:
    """``received`` holds ``sent`` intact, starting at a frame boundary after some silence.

    The engine clock runs on its own (silence when the inbox is empty), so the echo's position
    in the output depends on timing; its content and frame alignment do not.
    """
    out = np.concatenate([from_pcm16(frame) for frame in received])
    loud = [i for i in range(len(received)) if np.abs(from_pcm16(received[i])).max() > 1e-3]
    assert loud, "no echo of the sent audio in the output"
    start = loud[0] * FRAME
    assert len(out) - start >= len(sent), "the echo was cut short"
    np.testing.assert_allclose(out[start : start + len(sent)], sent, atol=2e-4)


async def open_peer(
    *,
    key: str | None = None,
    cookie: str | None = None,
    origin: bytes | None = None,
    path: str = "/v1/realtime",
) -> tuple[Peer, bool, Any]:
    headers = [(b"host", ALLOWED_ORIGIN.split(b"//")[1])]  # a browser's page and socket share the site's origin
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    if cookie is not None:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    if origin is not None:
        headers.append((b"origin", origin))
    comm = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await comm.connect(timeout=5)
    return Peer(comm), connected, code


async def ready_peer(account: Account, **kwargs: Any) -> tuple[Peer, dict[str, Any]]:
    """A connected peer whose session is live; returns it with its session.created event."""
    peer, connected, code = await open_peer(key=account.key, **kwargs)
    assert connected, code
    created = await peer.until("session.created")
    return peer, created
