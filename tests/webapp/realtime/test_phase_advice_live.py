"""The phase advice (``session.metrics``' ``input_shift_ms``, docs/protocol.md) as a real client gets it: a real
daphne with the echo engine in its process, a real WebSocket client pacing 80 ms frames on its own clock.

The client does not know the engine's tick, so its phase is whatever it is. It moves its cut once on purpose,
half a period later than the first advice says, so that a frame comes after its tick; following the advice from
there must bring it to no move at all within a few moves, with the frame ends' wait well down from where the late
frame left it.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from websockets.sync.client import connect

from bench.serving_callers import PhaseFollower
from tests.live_server import live_server_env, run_live_server
from webapp.accounts.services import apikey_create
from webapp.conversations.protocol import audio_frame

RATE = 24_000
FRAME = 1920  # 80 ms
HALF_PERIOD_MS = 40.0


class PacedClient:
    """Sends 80 ms frames of silence (quiet: the audio a move frees is trimmed at once) on an absolute schedule
    from a thread; ``move(samples)`` makes the next frame that much longer (or shorter)."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.sent_samples = 0
        self._extra = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.moved_to = 0  # input samples sent up to the end of the latest changed frame
        self.thread = threading.Thread(target=self._run, daemon=True)

    def move(self, samples: int) -> None:
        with self._lock:
            self._extra = samples

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                extra, self._extra = self._extra, 0
            length = FRAME + extra
            due += length / RATE
            time.sleep(max(0.0, due - time.monotonic()))
            self.ws.send(audio_frame(bytes(2 * length)))
            self.sent_samples += length
            if extra:
                self.moved_to = self.sent_samples

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)


def advice_after(ws, since: int, deadline: float) -> dict:
    """The first session.metrics carrying advice measured wholly on audio sent from ``since`` on."""
    while time.monotonic() < deadline:
        message = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(message, bytes):
            continue
        event = json.loads(message)
        assert event["type"] != "error", event
        if event["type"] != "session.metrics":
            continue
        metrics = event["metrics"]
        if "input_shift_ms" in metrics and metrics["input_shift_from_samples"] >= since:
            return metrics
    raise AssertionError(f"no advice measured on audio from sample {since} on")


@pytest.mark.django_db(transaction=True)
def test_a_client_moved_half_a_period_off_is_told_so_and_following_the_advice_brings_it_back(django_db_blocker):
    user = get_user_model().objects.create_user(username="phase-follower", password="pw-for-tests-only")
    key = apikey_create(user=user, name="phase advice")[1]
    headers = {"Authorization": f"Bearer {key}"}
    with run_live_server(django_db_blocker, live_server_env("echo")) as server:
        with connect(server.ws_url + "/v1/realtime?model=echo", additional_headers=headers, open_timeout=10) as ws:
            while json.loads(ws.recv(timeout=10))["type"] != "session.created":
                pass
            ws.send(json.dumps({"type": "session.update", "session": {"duplex": {"binary_audio": True}}}))
            client = PacedClient(ws)
            client.thread.start()
            deadline = time.monotonic() + 40
            try:
                first = advice_after(ws, 0, deadline)
                # Off on purpose: the next frame half a period later than the advice says, so it comes after its
                # tick (that tick finds nothing, and the margin grows by how late it came, as for any late frame).
                off_by_ms = first["input_shift_ms"] + HALF_PERIOD_MS
                client.move(round((off_by_ms if off_by_ms > 0 else off_by_ms + 2 * HALF_PERIOD_MS) * RATE / 1000))
                while not client.moved_to:
                    time.sleep(0.01)
                off = advice_after(ws, client.moved_to, deadline)
                off_wait_ms = off["in_wait_ms_max"]
                assert off["input_shift_ms"] and off_wait_ms >= HALF_PERIOD_MS, (first, off)
                follower = PhaseFollower()
                follower.moved_at = client.moved_to
                advice, moves = off, 0
                while advice["input_shift_ms"]:
                    assert moves < 5, f"still told to move after {moves} moves: {advice}"
                    follower.on_metrics(advice)
                    client.move(follower.take(client.sent_samples, FRAME, RATE))
                    moved_before = client.moved_to
                    while client.moved_to == moved_before:
                        time.sleep(0.01)
                    follower.moved_at = client.moved_to
                    moves += 1
                    advice = advice_after(ws, client.moved_to, deadline)
                settled = [advice_after(ws, client.moved_to, deadline)["in_wait_ms_max"] for _ in range(3)]
            finally:
                client.stop()
            ws.send(json.dumps({"type": "session.close"}))
    assert advice["input_shift_ms"] == 0.0
    # the frame ends' longest wait in a report: the grown margin and the safety plus this machine's jitter, down
    # from the whole period the frames stood after the late one
    assert float(np.median(settled)) <= off_wait_ms - 20, (off_wait_ms, settled)
