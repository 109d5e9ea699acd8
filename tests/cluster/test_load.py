"""Serving under load, sized for a 2-core CI host: 40 callers through nginx, two daphne processes and two
echo inference services, each streaming paced 80 ms frames for 30 s with playback acks, as the call page does.

What must hold (no timing asserts here: timings belong in bench/): every caller is admitted, no frame
the caller sent is lost (the engine took every one: ``frames_in`` equals frames sent, ``dropped_frames``
0), no error event of any kind, no traceback in any process's log, and every call's recording is
processed complete (``ready``) and lasts as long as the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.cluster.topology import Cluster

CALLERS = 40
CALL_S = 30.0
PERIOD_S = 0.08
FRAMES = round(CALL_S / PERIOD_S)
RAMP_S = 5.0  # connects spread over this long, as callers arrive
ACK_EVERY = 6  # frames between playback acks (~0.5 s, as the call page sends them)

USERS_SCRIPT = f"""
import json
from django.contrib.auth import get_user_model
from webapp.accounts.services import apikey_create
keys = {{}}
for i in range({CALLERS}):
    user, _ = get_user_model().objects.get_or_create(username=f"load{{i}}")
    keys[user.username] = apikey_create(user=user, name="load test")[1]
print("KEYS=" + json.dumps(keys))
"""

RECORDINGS_SCRIPT = """
import json
from webapp.recordings.models import Recording
rows = [
    {"session_id": r.session_id, "status": r.status, "reason": r.status_reason, "duration_s": r.duration_s}
    for r in Recording.objects.filter(user__username__startswith="load")
]
print("ROWS=" + json.dumps(rows))
"""


def speech_frame(index: int) -> bytes:
    """80 ms of a voiced-like tone as a binary audio frame (kind 0x01 + pcm16), as the call page sends it."""
    t = (np.arange(1920) + index * 1920) / 24_000
    signal = 0.2 * np.sin(2 * np.pi * (180 + 40 * np.sin(index / 7)) * t)
    return b"\x01" + (signal * 32767).astype("<i2").tobytes()


FRAME_POOL = [speech_frame(i) for i in range(25)]


@dataclass
class LoadCaller:
    key: str
    session_id: str | None = None
    sent: int = 0
    audio_in: int = 0
    errors: list[dict] = field(default_factory=list)
    metrics: list[dict] = field(default_factory=list)
    closed_reason: str | None = None
    call_s: float = 0.0
    updated: bool = False
    send_late_ms: float = 0.0  # the load generator's own lateness: how late its worst frame went out
    started: float | None = None  # when the first frame went out
    drops_at: list[float] = field(default_factory=list)  # seconds into the call of each report with new drops

    async def run(self, ws_url: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        async with connect(
            f"{ws_url}/v1/realtime?model=echo",
            additional_headers={"Authorization": f"Bearer {self.key}"},
            open_timeout=60,
            max_size=None,
        ) as ws:
            reader = asyncio.create_task(self._read(ws))
            await self._wait(lambda: self.session_id is not None, 60, "session.created")
            update = {"type": "session.update", "session": {"duplex": {"binary_audio": True}}}
            await ws.send(json.dumps(update))
            await self._wait(lambda: self.updated, 30, "session.updated")
            started = self.started = time.monotonic()
            for k in range(FRAMES):  # paced against the clock, so a late send does not shift the rest
                self.send_late_ms = max(self.send_late_ms, (time.monotonic() - started - k * PERIOD_S) * 1000)
                await ws.send(FRAME_POOL[k % 25])
                self.sent += 1
                if k % ACK_EVERY == ACK_EVERY - 1:
                    played_ms = max(0.0, (self.audio_in - 3) * PERIOD_S * 1000)
                    await ws.send(json.dumps({"type": "playback.ack", "played_ms": played_ms}))
                await asyncio.sleep(max(0.0, started + (k + 1) * PERIOD_S - time.monotonic()))
            # Every frame sent must reach the engine: wait for a metrics report that counts them all.
            await self._wait(lambda: self.frames_in() >= self.sent, 15, "frames_in to reach the frames sent")
            self.call_s = time.monotonic() - started
            await ws.send(json.dumps({"type": "session.close"}))
            await self._wait(lambda: self.closed_reason is not None, 15, "session.closed")
            reader.cancel()

    def frames_in(self) -> int:
        return int(self.metrics[-1].get("frames_in", 0)) if self.metrics else 0

    def dropped(self) -> int:
        return max((int(m.get("dropped_frames", 0)) for m in self.metrics), default=0)

    def summary(self) -> dict:
        """What the server said about this call (for a failure's message)."""
        last = self.metrics[-1] if self.metrics else {}
        worst = {name: max((float(m.get(name, 0)) for m in self.metrics), default=0.0)
                 for name in ("lag_ms", "in_wait_ms_max", "tick_ms_p99")}  # fmt: skip
        return {"sent": self.sent, "frames_in": self.frames_in(), "dropped": self.dropped(),
                "trimmed": last.get("trimmed_frames"), "underruns": last.get("underruns"),
                "late_ticks": last.get("late_ticks"), "errors": [e["code"] for e in self.errors],
                "send_late_ms": round(self.send_late_ms, 1), "drops_at_s": self.drops_at, **worst}  # fmt: skip

    async def _read(self, ws) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self._read_events(ws)

    async def _read_events(self, ws) -> None:
        async for message in ws:
            if isinstance(message, bytes):
                self.audio_in += 1
                continue
            event = json.loads(message)
            kind = event["type"]
            if kind == "session.created":
                self.session_id = event["session"]["id"]
            elif kind == "session.updated":
                self.updated = True
            elif kind == "response.output_audio.delta":
                self.audio_in += 1
            elif kind == "session.metrics":
                if self.started is not None and int(event["metrics"].get("dropped_frames", 0)) > self.dropped():
                    self.drops_at.append(round(time.monotonic() - self.started, 1))
                self.metrics.append(event["metrics"])
            elif kind == "error":
                self.errors.append(event["error"])
            elif kind == "session.closed":
                self.closed_reason = event["reason"]

    async def _wait(self, condition, within_s: float, what: str) -> None:
        deadline = time.monotonic() + within_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.key[:8]}: no {what} within {within_s} s (errors: {self.errors})")
            await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def loaded_cluster():
    # Slots for every caller on either service: this test is about carrying the calls, not admission. The callers
    # send tones: a transcript of each caller's side would be 3.5 s of a recogniser's CPU per recording spent
    # hearing nothing (140 s of the test's 2 cores), so the recordings are processed as the suite's settings do
    # it (tests/webapp/recordings/test_caller_transcript.py covers the transcript with speech).
    cluster = Cluster(
        services=2,
        daphnes=2,
        slots=CALLERS,
        heartbeat_s=0.5,
        heartbeat_timeout_s=5.0,
        celery_workers=2,
        extra_env={"PARLEY_TRANSCRIBER": "off"},
    )
    with cluster as running:
        out = running.manage("shell", "-c", USERS_SCRIPT)
        running.keys = json.loads(next(line for line in out.splitlines() if line.startswith("KEYS="))[5:])
        yield running


def recordings(cluster: Cluster) -> dict[str, dict]:
    out = cluster.manage("shell", "-c", RECORDINGS_SCRIPT)
    rows = json.loads(next(line for line in out.splitlines() if line.startswith("ROWS="))[5:])
    return {row["session_id"]: row for row in rows}


async def test_forty_callers_for_thirty_seconds_lose_nothing(loaded_cluster):
    cluster = loaded_cluster
    callers = [LoadCaller(cluster.keys[f"load{i}"]) for i in range(CALLERS)]
    results = await asyncio.gather(
        *(c.run(cluster.nginx.ws_url, RAMP_S * i / CALLERS) for i, c in enumerate(callers)), return_exceptions=True
    )
    failures = [f"{type(r).__name__}: {str(r)[:200]}" for r in results if isinstance(r, BaseException)]
    troubled = {c.session_id: c.summary() for c in callers if c.errors or c.dropped() or c.frames_in() < c.sent}
    if failures or troubled:
        pytest.fail(json.dumps({"failures": failures, "troubled": troubled}, indent=None), pytrace=False)
    assert {c.closed_reason for c in callers} == {"client_close"}
    assert all(c.sent == FRAMES and c.audio_in >= FRAMES for c in callers)

    # Every call's recording is processed complete, as long as the call (Celery worker on the Redis broker).
    ids = {c.session_id for c in callers}
    deadline = time.monotonic() + 240
    while True:
        rows = recordings(cluster)
        done = {
            sid: row for sid, row in rows.items() if sid in ids and row["status"] not in ("recording", "processing")
        }
        if len(done) == len(ids) or time.monotonic() > deadline:
            break
        await asyncio.sleep(2)
    incomplete = {sid: row for sid, row in done.items() if row["status"] != "ready"}
    assert len(done) == len(ids) and not incomplete, (len(done), incomplete)
    calls = {c.session_id: c.call_s for c in callers}
    short = {sid: (row["duration_s"], calls[sid]) for sid, row in done.items() if row["duration_s"] < calls[sid] - 1.0}
    assert short == {}, f"recordings shorter than their calls (recorded s, call s): {short}"

    logs = {p.name: p.log.read_text(errors="replace") for p in cluster.processes if p.log.exists()}
    tracebacks = {name: text[text.index("Traceback") :][:2000] for name, text in logs.items() if "Traceback" in text}
    assert tracebacks == {}, tracebacks
