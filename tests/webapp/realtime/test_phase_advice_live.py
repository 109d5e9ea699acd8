"""The phase advice (``session.metrics``' ``input_shift_ms``, docs/protocol.md) as a real client gets it: a real
daphne with the echo engine in its process, a real WebSocket client pacing 80 ms frames on its own clock.

The client does not know the engine's tick, so its phase is whatever it is. It moves its phase on purpose by a
pause of two periods and a bit (a muted microphone: no frame is late, the server only finds the next ones at
another phase), to half a period beyond where the first advice says to land; the next advice must ask for a move,
and following the advice from there must bring it to no move at all within a few moves, with the frame ends'
wait well down from where the pause left it.
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
    from a thread; ``move(samples)`` makes the next frame that much longer (or shorter), ``pause(s)`` sends
    nothing for that long before it."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.sent_samples = 0
        self._extra = 0
        self._pause_s = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.moved_to = 0  # input samples sent up to the end of the latest changed frame
        self.thread = threading.Thread(target=self._run, daemon=True)

    def move(self, samples: int) -> None:
        with self._lock:
            self._extra = samples

    def pause(self, seconds: float) -> None:
        with self._lock:
            self._pause_s = seconds

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                (extra, self._extra), (pause_s, self._pause_s) = (self._extra, 0), (self._pause_s, 0.0)
            length = FRAME + extra
            due += length / RATE + pause_s
            time.sleep(max(0.0, due - time.monotonic()))
            self.ws.send(audio_frame(bytes(2 * length)))
            self.sent_samples += length
            if extra or pause_s:
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
                # The pieces land first["input_shift_ms"] beyond the goal: a pause that long less half a period
                # (modulo the period), and two periods more, lands them half a period beyond it.
                off_by_ms = (first["input_shift_ms"] - HALF_PERIOD_MS) % (2 * HALF_PERIOD_MS)
                client.pause((4 * HALF_PERIOD_MS + off_by_ms) / 1000)
                while not client.moved_to:
                    time.sleep(0.01)
                off = advice_after(ws, client.moved_to, deadline)
                off_wait_ms = off["in_wait_ms_max"]
                assert off["input_shift_ms"] and off_wait_ms >= HALF_PERIOD_MS - 5, (first, off)
                follower = PhaseFollower()
                follower.moved_at = client.moved_to
                advice, moves, settled = off, 0, []
                # A piece that comes late here (the suite runs beside CPU-bound tests) holds any move closer back
                # for a minute of calm (ADVICE_CALM_WINDOWS): the advice is 0 meanwhile, then moves on.
                deadline += 70
                while advice["input_shift_ms"] or not settled_down(settled, off_wait_ms):
                    if advice["input_shift_ms"]:
                        assert moves < 8, f"still told to move after {moves} moves: {advice}"
                        follower.on_metrics(advice)
                        client.move(follower.take(client.sent_samples, FRAME, RATE))
                        moved_before = client.moved_to
                        while client.moved_to == moved_before:
                            time.sleep(0.01)
                        follower.moved_at = client.moved_to
                        moves += 1
                    advice = advice_after(ws, client.moved_to, deadline)
                    settled = [*settled, advice["in_wait_ms_max"]][-3:] if not advice["input_shift_ms"] else []
            finally:
                client.stop()
            ws.send(json.dumps({"type": "session.close"}))
    assert advice["input_shift_ms"] == 0.0 and settled_down(settled, off_wait_ms), (off_wait_ms, settled)


def settled_down(waits: list[float], off_wait_ms: float) -> bool:
    """Three reports with no move whose frame ends' longest wait (the margin and the safety plus this machine's
    jitter) is well down from the half period more the pause left."""
    return len(waits) == 3 and float(np.median(waits)) <= off_wait_ms - 20
