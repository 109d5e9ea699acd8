"""Recordings tests write real raw recordings with the inference service's recorder into a temp folder."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable

import numpy as np
import pytest
from asgiref.sync import async_to_sync

from inference import api
from inference.engines.base import SlotOutput
from inference.recording.chunks import folder_state
from inference.recording.recorder import Recorder, record_steps
from webapp.recordings import services
from webapp.recordings.models import Recording

RATE, CHUNK, PERIOD_MS = 24_000, 1920, 80
META = {"engine": "echo", "checkpoint": None, "input_rate": RATE, "output_rate": RATE,
        "chunk_period_ms": PERIOD_MS, "input_chunk_samples": CHUNK, "voice": None}  # fmt: skip
WORDS = ["Hello", " there.", " How", " are", " you?"]


@pytest.fixture
def raw_dir(tmp_path, monkeypatch):
    """``PARLEY_RECORDINGS_DIR`` for this test; the facade re-reads its config around it."""
    folder = tmp_path / "raw"
    folder.mkdir()
    monkeypatch.setenv("PARLEY_RECORDINGS_DIR", str(folder))
    async_to_sync(api.shutdown)()
    yield folder
    monkeypatch.undo()
    async_to_sync(api.shutdown)()


@pytest.fixture
def media_dir(tmp_path, settings):
    settings.STORAGES = {
        **settings.STORAGES,
        "recordings": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": tmp_path / "media"},
        },
    }
    return tmp_path / "media"


@pytest.fixture
def recorder(raw_dir):
    recorder = Recorder(raw_dir)
    recorder.start()
    yield recorder
    recorder.stop()


def tone(freq: float, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(CHUNK) / RATE
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def record_raw_call(recorder: Recorder, session_id: str, *, steps: int = 40, finish: str | None = "client_close"):
    """A call: the caller hums 300 Hz, the agent answers at 600 Hz with words, one barge-in, one pause."""
    recording = recorder.begin(session_id, META)
    agent = (tone(600) * 32767).astype("<i2").tobytes()
    for step in range(steps):
        text = WORDS[step % len(WORDS)] if step < 10 or step >= 25 else ""
        record_steps([recording.step_item(tone(300), agent, SlotOutput(audio=np.zeros(0), text=text), 2.0 + step % 3)])
        if step % 4 == 0:
            recording.event("ack", played_ms=step * PERIOD_MS - 120.0, sent_ms=step * PERIOD_MS)
        if step == 12:
            recording.event("epoch", epoch=1, unplayed_ms=240.0)
        if step == 20:
            recording.event("pause")
        if step == 21:
            recording.event("resume")
    if finish:
        recording.finish(finish)
        wait_for(lambda: folder_state(recorder.root / session_id) == "finished")
    return recording


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def make_recording(django_user_model):
    counter = iter(range(1, 1_000_000))

    def make(user=None, *, session_id: str | None = None, **fields) -> Recording:
        if user is None:
            user = django_user_model.objects.create_user(username=f"user{next(counter)}", password="x")
        session_id = session_id or f"sess_{next(counter):08d}"
        services.recording_sync(
            user=user,
            session_id=session_id,
            recorded=True,
            engine="echo",
            persona_id=None,
            persona_version=None,
            voice=None,
        )
        recording = Recording.objects.get(session_id=session_id)
        if fields:
            Recording.objects.filter(pk=recording.pk).update(**fields)
            recording.refresh_from_db()
        return recording

    return make


def seed_review_set() -> None:
    """The label set and reviewers group of migration 0005 (a transactional test's flush empties them)."""
    from django.apps import apps

    importlib.import_module("webapp.recordings.migrations.0006_seed_labels_and_reviewers").seed(apps, None)


@pytest.fixture
def review_seed(transactional_db) -> None:
    seed_review_set()
