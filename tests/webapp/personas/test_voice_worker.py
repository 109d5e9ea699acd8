"""The voice task on a real Celery worker through a real Redis broker, computing a real lockstep prompt
(the PersonaPlex test checkpoint's Mimi) that the engine then reads instead of the wav."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile
from django.core.files.base import ContentFile

from inference import api, embedded
from inference.config import InferenceConfig
from inference.models.moshi.codes_prompt import read_codes_prompt
from webapp.celery import app as celery_app
from webapp.personas import services
from webapp.personas.models import Voice

pytestmark = [
    pytest.mark.usefixtures("single_torch_thread"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.services,
]
CHECKPOINT = Path(__file__).resolve().parents[2] / "data" / "personaplex" / "ckpt"


@pytest.fixture
def personaplex_config(monkeypatch):
    """The web tier's view of the inference config: a PersonaPlex engine on the test checkpoint."""
    monkeypatch.setattr(embedded._process, "_config", InferenceConfig(engine="personaplex", checkpoint=CHECKPOINT))


@pytest.fixture
def celery_worker_on_redis(redis_server):
    """A real Celery worker (a thread of this process, sharing the test database) on a real Redis broker."""
    from celery.contrib.testing.worker import start_worker

    saved = {key: celery_app.conf[key] for key in ("broker_url", "task_always_eager")}
    celery_app.conf.update(broker_url=redis_server.url, task_always_eager=False)
    try:
        with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            yield
    finally:
        celery_app.conf.update(saved)


def clip_wav(seconds: float = 4.0, rate: int = 44_100) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * 0.5 * (1 + np.sin(2 * np.pi * 3 * t)) * np.sin(2 * np.pi * (170 + 30 * np.sin(t)) * t)
    buffer = io.BytesIO()
    soundfile.write(buffer, x.astype(np.float32), rate, format="FLAC")
    return buffer.getvalue()


def test_voice_task_runs_on_a_worker_and_stores_the_lockstep_prompt(
    personaplex_config, celery_worker_on_redis, redis_server, django_user_model
):
    from webapp.personas.tasks import process_voice

    user = django_user_model.objects.create_user("alice")
    voice = Voice.objects.create(owner=user, name="worker-voice", kind=Voice.Kind.CLONED)
    voice.reference_audio.save("clip.flac", ContentFile(clip_wav()), save=True)
    # Queued on the broker through a connection of its own: the app's pooled one may still be the memory://
    # transport an earlier test in this process opened. This thread only watches the row change.
    with celery_app.connection_for_write(redis_server.url) as connection:
        process_voice.apply_async((voice.pk,), connection=connection)
    seen_stages = set()
    deadline = time.monotonic() + 120
    while voice.status not in ("ready", "failed"):
        assert time.monotonic() < deadline, (voice.status, voice.progress_stage)
        time.sleep(0.05)
        voice.refresh_from_db()
        seen_stages.add(voice.progress_stage)
    assert voice.status == "ready" and voice.progress_percent == 100, voice.failure_reason
    assert seen_stages - {"ready"}, "progress was visible while the worker ran"
    (prompt,) = voice.prompts.all()
    assert prompt.family == "lockstep" and prompt.model_key == api.voice_prompt_targets()[0].model_key
    codes = read_codes_prompt(prompt.file.path)
    assert codes.shape[0] == 8 and codes.shape[1] == -(-int(voice.duration_s * 24_000) // 1920)
    # the session gets the stored codes, not the wav, for this engine
    ref = services.voice_ref(voice)
    assert ref.path == Path(prompt.file.path) and ref.voice_id == str(voice.pk)
