"""Recordings against real services: an S3-compatible server (moto's server mode, a real HTTP process)
and a real Celery worker consuming from a real Redis broker."""

from __future__ import annotations

import time

import boto3
import pytest
from botocore.config import Config
from django.urls import reverse

from tests.services import free_port
from webapp.celery import app as celery_app
from webapp.recordings import services, tasks
from webapp.recordings.models import Recording

from .conftest import record_raw_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

NO_RETRIES = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2, read_timeout=5)


def s3_storages(settings, s3, endpoint_url: str | None = None) -> dict:
    return {
        **settings.STORAGES,
        "recordings": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": s3.bucket,
                "endpoint_url": endpoint_url or s3.endpoint_url,
                "region_name": s3.region,
                "access_key": s3.access_key,
                "secret_key": s3.secret_key,
                "default_acl": None,
                "client_config": NO_RETRIES,
            },
        },
    }


def bucket_keys(s3, prefix: str) -> set[str]:
    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        region_name=s3.region,
    )
    return {item["Key"] for item in client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents", [])}


def test_recordings_are_stored_served_and_deleted_in_an_s3_bucket(
    s3_server, settings, recorder, make_recording, client, django_user_model
):
    settings.STORAGES = s3_storages(settings, s3_server)
    user = django_user_model.objects.create_user(username="s3user", password="x")
    recording = make_recording(user, session_id="sess_s3")
    record_raw_call(recorder, "sess_s3", steps=15)
    services.recording_close(session_id="sess_s3", reason="client_close")
    recording.refresh_from_db()
    assert recording.status == Recording.Status.READY, recording.status_reason
    prefix = f"recordings/{user.pk}/sess_s3/"
    assert bucket_keys(s3_server, prefix) == {prefix + name for name in
        ("stereo.ogg", "stereo.wav", "peaks.json", "transcript.json", "timeline.json", "steps.prc")}  # fmt: skip
    client.force_login(user)
    wav = client.get(reverse("recording-file", args=[recording.pk, "wav"]))
    assert b"".join(wav.streaming_content)[:4] == b"RIFF"
    client.post(reverse("recording-delete", args=[recording.pk]))
    assert bucket_keys(s3_server, prefix) == set()


def test_an_unreachable_bucket_is_retried_then_failed_keeping_the_raw_chunks(
    s3_server, settings, recorder, make_recording
):
    settings.STORAGES = s3_storages(settings, s3_server, endpoint_url=f"http://127.0.0.1:{free_port()}")
    recording = make_recording(session_id="sess_nobucket")
    record_raw_call(recorder, "sess_nobucket", steps=5)
    services.recording_close(session_id="sess_nobucket", reason="client_close")
    recording.refresh_from_db()
    assert recording.status == Recording.Status.FAILED
    assert recording.attempts == tasks.STORAGE_RETRIES + 1 and "Could not connect" in recording.status_reason
    assert (recorder.root / "sess_nobucket").exists()


@pytest.fixture
def celery_on_redis(redis_server):
    """Celery pointed at a real Redis broker (not eager); the test starts the worker when it wants one."""
    saved = {key: celery_app.conf[key] for key in ("broker_url", "task_always_eager")}
    forget_broker_state()
    celery_app.conf.update(broker_url=redis_server.url, task_always_eager=False)
    try:
        yield
    finally:
        forget_broker_state()
        celery_app.conf.update(saved)


def a_celery_worker():
    """A real Celery worker in a thread of this process (it shares the test database)."""
    from celery.contrib.testing.worker import start_worker

    return start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=10)


def forget_broker_state() -> None:
    """Drop what the app built for the previous broker: its connection pool and its AMQP helper, a
    cached property that otherwise keeps publishing through the in-memory transport of the eager
    default once any earlier test sent a task (checked: without it, the worker never sees the task)."""
    celery_app.close()
    celery_app.__dict__.pop("amqp", None)


def test_post_processing_runs_on_a_celery_worker_through_redis(
    celery_on_redis, media_dir, recorder, make_recording
):
    recording = make_recording(session_id="sess_worker")
    record_raw_call(recorder, "sess_worker", steps=15)
    # The consumer's path: close -> on_commit -> queued on the broker, not run inline. No worker runs
    # yet, so the recording must still wait (with a worker already up, it could be mid-processing here).
    services.recording_close(session_id="sess_worker", reason="client_close")
    recording.refresh_from_db()
    assert recording.status == Recording.Status.RECORDING
    with a_celery_worker():  # the queued task waits on Redis for the worker that starts now
        deadline = time.monotonic() + 60
        while recording.status != Recording.Status.READY:
            assert time.monotonic() < deadline, recording.status
            time.sleep(0.05)
            recording.refresh_from_db()
    assert recording.files and recording.progress == 1.0
