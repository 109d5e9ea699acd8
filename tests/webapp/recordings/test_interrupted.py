"""The inference service (``python -m inference serve``, a separate process) is killed mid-call: the
recording ends ``interrupted``, holds the call's audio to within a second of the kill, and is
processed into a playable file once the service is back."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from asgiref.sync import async_to_sync

from inference import api
from inference.contracts import Ready, SessionRequest
from tests.inference.event_helpers import EventReader
from tests.inference_service_process import start_inference_service
from webapp.recordings import tasks
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

pytestmark = pytest.mark.django_db(transaction=True)

CALL_S = 4.0
FRAME_S = 0.08


def start_service(socket_path: str, raw_dir: Path) -> subprocess.Popen:
    proc, _ = start_inference_service(
        socket_path, PARLEY_ENGINE="echo", PARLEY_SLOTS="1", PARLEY_RECORDINGS_DIR=str(raw_dir), PARLEY_RECORD="auto"
    )
    return proc


def speech_like(seconds: float, rate: int = 24_000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    voice = 0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    return (voice * 32767).astype("<i2")


@pytest.fixture
def service(raw_dir, monkeypatch):
    folder = tempfile.mkdtemp(prefix="parley-", dir="/tmp")  # unix socket paths must stay short
    socket_path = os.path.join(folder, "inference.sock")
    monkeypatch.setenv("PARLEY_INFERENCE_URL", f"unix://{socket_path}")
    monkeypatch.setenv("PARLEY_INFERENCE_TOKEN", secrets.token_urlsafe(24))  # the service and this client share it
    async_to_sync(api.shutdown)()
    procs = [start_service(socket_path, raw_dir)]
    yield socket_path, procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
    async_to_sync(api.shutdown)()
    shutil.rmtree(folder, ignore_errors=True)


def test_a_killed_service_leaves_an_interrupted_recording_as_long_as_the_call(
    service, raw_dir, media_dir, make_recording, django_user_model
):
    socket_path, procs = service
    user = django_user_model.objects.create_user(username="killed", password="x")

    async def call() -> tuple[str, float]:
        handle = await api.open_session(SessionRequest(user_key=str(user.pk)))
        ready = await EventReader(handle).until(Ready, within_s=10)
        assert ready.recorded
        audio = speech_like(CALL_S + 2).tobytes()
        frame = int(FRAME_S * 24_000) * 2
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < CALL_S:
            await handle.append_audio(audio[sent : sent + frame], encoding="pcm16", rate=24_000)
            sent += frame
            await asyncio.sleep(max(0.0, started + sent / frame * FRAME_S - time.monotonic()))
        procs[0].send_signal(signal.SIGKILL)  # no chance to close anything
        procs[0].wait(10)
        return ready.session_id, time.monotonic() - started

    session_id, call_s = asyncio.run(call())
    recording = make_recording(user, session_id=session_id)  # what the consumer did at session.created
    assert tasks.sweep_recordings.delay().get() == 0  # the killed service never wrote end.json
    recording.refresh_from_db()
    assert recording.status == Recording.Status.RECORDING

    procs.append(start_service(socket_path, raw_dir))  # the restarted service marks it interrupted
    assert tasks.sweep_recordings.delay().get() == 1
    recording.refresh_from_db()
    assert recording.status == Recording.Status.INTERRUPTED, recording.status_reason
    assert abs(recording.duration_s - call_s) <= 1.0, (recording.duration_s, call_s)
    with recordings_storage().open(recording.files["wav"]) as f:
        stereo, rate = sf.read(io.BytesIO(f.read()), dtype="float32")
    assert abs(len(stereo) / rate - call_s) <= 1.0
    assert np.sqrt(np.mean(stereo[:, 0] ** 2)) > 0.05  # the caller's audio is there
    assert np.sqrt(np.mean(stereo[:, 1] ** 2)) > 0.05  # and its echo, as the agent sent it
