"""Post-processing (eager Celery, the embedded default) on real raw recordings and real storage."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf
from django.core.files.storage import FileSystemStorage

from inference.recording.chunks import META_FILE, chunk_files
from webapp.recordings import services, tasks
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

from .conftest import CHUNK, RATE, record_raw_call

pytestmark = pytest.mark.django_db(transaction=True)


def close_and_process(recording: Recording) -> Recording:
    services.recording_close(session_id=recording.session_id, reason="client_close")  # on_commit -> eager task
    recording.refresh_from_db()
    return recording


def dominant_hz(track: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(track[:RATE]))
    return float(np.argmax(spectrum)) * RATE / min(len(track), RATE)


def test_a_closed_call_becomes_a_ready_stereo_recording(recorder, media_dir, make_recording):
    recording = make_recording(session_id="sess_ready")
    record_raw_call(recorder, "sess_ready", steps=40)
    recording = close_and_process(recording)
    assert recording.status == Recording.Status.READY, recording.status_reason
    assert recording.progress == 1.0 and recording.close_reason == "client_close"
    assert recording.duration_s == pytest.approx(40 * 0.08, abs=0.01)
    assert recording.raw_bytes > 40 * CHUNK * 2 * 2 and recording.stored_bytes > 0
    storage = recordings_storage()
    assert set(recording.files) == {"ogg", "wav", "peaks", "transcript", "timeline", "steps"}  # steps: for replays
    with storage.open(recording.files["wav"]) as f:
        stereo, rate = sf.read(io.BytesIO(f.read()), dtype="float32")
    assert rate == RATE and stereo.shape == (40 * CHUNK, 2)
    assert dominant_hz(stereo[:, 0]) == pytest.approx(300, abs=15)  # caller left
    assert dominant_hz(stereo[:, 1]) == pytest.approx(600, abs=15)  # agent right
    with storage.open(recording.files["ogg"]) as f:
        opus, opus_rate = sf.read(io.BytesIO(f.read()), dtype="float32")
    assert opus.shape[1] == 2 and abs(len(opus) / opus_rate - 3.2) < 0.05
    lines = json.loads(storage.open(recording.files["transcript"]).read())["lines"]
    assert lines[0] == {"start": 0.0, "end": 0.16, "text": "Hello there.", "epoch": 0}
    assert any(line["epoch"] == 1 for line in lines)  # words after the barge-in are a new epoch
    assert "How are you?" in recording.transcript_text
    timeline = json.loads(storage.open(recording.files["timeline"]).read())
    kinds = [m["kind"] for m in timeline["markers"]]
    assert "barge_in" in kinds and "pause" in kinds
    assert len(timeline["ticks"]) == 40 and timeline["tick_ms_p99"] == pytest.approx(4.0, abs=0.01)
    assert timeline["heard"][1] == {"t": 0.4, "played_ms": 200.0, "sent_ms": 320.0}  # after step 4 ended
    peaks = json.loads(storage.open(recording.files["peaks"]).read())
    assert max(peaks["caller"]) == pytest.approx(0.3, abs=0.02) and len(peaks["agent"]) == 160
    assert not (recorder.root / "sess_ready").exists()  # raw chunks go once the files are stored


def test_a_corrupted_chunk_gives_partial_naming_the_chunk(recorder, media_dir, make_recording):
    recording = make_recording(session_id="sess_damaged")
    record_raw_call(recorder, "sess_damaged", steps=40)
    chunk = chunk_files(recorder.root / "sess_damaged")[0]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4] = b"\x00\xff\x00\xff"
    chunk.write_bytes(bytes(data))
    recording = close_and_process(recording)
    assert recording.status == Recording.Status.PARTIAL
    assert recording.status_reason.startswith("chunk-000000.prc: ")
    assert recording.files  # what was readable is playable


def test_an_unreadable_recording_fails_with_the_reason(recorder, media_dir, make_recording):
    recording = make_recording(session_id="sess_nometa")
    record_raw_call(recorder, "sess_nometa", steps=5)
    (recorder.root / "sess_nometa" / META_FILE).write_text("{not json")
    recording = close_and_process(recording)
    assert recording.status == Recording.Status.FAILED
    assert "meta.json" in recording.status_reason
    assert (recorder.root / "sess_nometa").exists()  # kept for a later look


def test_a_missing_raw_recording_fails(raw_dir, media_dir, make_recording):
    recording = close_and_process(make_recording(session_id="sess_never"))
    assert recording.status == Recording.Status.FAILED and "missing" in recording.status_reason


class FullDiskStorage(FileSystemStorage):
    """A storage whose disk is full: every save fails as the OS would say it."""

    def _save(self, name, content):
        raise OSError(28, "No space left on device")


def test_storage_faults_are_retried_then_failed_and_the_raw_chunks_kept(recorder, media_dir, make_recording, settings):
    settings.STORAGES = {**settings.STORAGES, "recordings": {"BACKEND": f"{__name__}.FullDiskStorage"}}
    recording = make_recording(session_id="sess_full")
    record_raw_call(recorder, "sess_full", steps=10)
    recording = close_and_process(recording)
    assert recording.status == Recording.Status.FAILED
    assert recording.attempts == tasks.STORAGE_RETRIES + 1
    assert "No space left on device" in recording.status_reason and "raw recording is kept" in recording.status_reason
    assert (recorder.root / "sess_full").exists()
    # The disk has room again: the next run succeeds from the kept chunks.
    settings.STORAGES = {
        **settings.STORAGES,
        "recordings": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": media_dir}},
    }
    assert tasks.process_recording.delay(recording.pk).get() == Recording.Status.READY
    assert not (recorder.root / "sess_full").exists()


def test_a_killed_services_recording_is_swept_up_as_interrupted(recorder, raw_dir, media_dir, make_recording):
    recording = make_recording(session_id="sess_killed")
    record_raw_call(recorder, "sess_killed", steps=25, finish=None)
    recorder.stop()  # writes what is queued; a session without end.json is what a kill leaves
    (raw_dir / "sess_killed" / "end.json").unlink()
    assert tasks.sweep_recordings.delay().get() == 0  # still open: nothing to do yet
    assert tasks.process_recording.delay(recording.pk).get() == "still recording"
    from inference.recording.recorder import Recorder

    Recorder(raw_dir).recover_interrupted()  # what the restarted service does first
    assert tasks.sweep_recordings.delay().get() == 1
    recording.refresh_from_db()
    assert recording.status == Recording.Status.INTERRUPTED
    assert recording.duration_s == pytest.approx(2.0, abs=0.01)


def test_purge_deletes_recordings_past_the_retention_period(recorder, media_dir, make_recording, settings):
    from datetime import timedelta

    from django.utils import timezone

    old = make_recording(session_id="sess_old")
    record_raw_call(recorder, "sess_old", steps=5)
    old = close_and_process(old)
    files = list(old.files.values())
    Recording.objects.filter(pk=old.pk).update(started_at=timezone.now() - timedelta(days=40))
    fresh = make_recording(session_id="sess_fresh")
    settings.PARLEY_RECORDING_RETENTION_DAYS = 30
    assert tasks.purge_recordings.delay().get() == 1
    assert list(Recording.objects.values_list("session_id", flat=True)) == [fresh.session_id]
    assert not any(recordings_storage().exists(name) for name in files)
    settings.PARLEY_RECORDING_RETENTION_DAYS = 0
    assert tasks.purge_recordings.delay().get() == 0


def test_a_storage_failure_and_the_checkpoint_reach_the_owner_without_server_paths(
    recorder, media_dir, make_recording, django_user_model, client, settings
):
    """A file where the user's recordings folder belongs: the OS names the full path in its error; the reason
    shown on the pages keeps the kind of fault only. The checkpoint is shown by name, not by path."""
    settings.STORAGES["recordings"]["OPTIONS"]["location"] = media_dir
    owner = django_user_model.objects.create_user(username="owner", password="x")
    (media_dir / "recordings").mkdir(parents=True)
    (media_dir / "recordings" / str(owner.pk)).write_bytes(b"not a folder")
    recording = close_and_process_recorded(recorder, make_recording(owner, session_id="sess_blocked"))
    assert recording.status == Recording.Status.FAILED and recording.attempts == tasks.STORAGE_RETRIES + 1
    assert "NotADirectoryError: Not a directory" in recording.status_reason, recording.status_reason
    Recording.objects.filter(pk=recording.pk).update(checkpoint="/srv/models/checkpoints/personaplex-7b")
    client.force_login(owner)
    for url in (f"/recordings/{recording.pk}/", "/recordings/", f"/recordings/{recording.pk}/status.json"):
        body = client.get(url).content.decode()
        assert "Not a directory" in body, url
        assert str(media_dir) not in body and "/srv/models" not in body and "sess_blocked/" not in body, url
    assert "personaplex-7b" in client.get(f"/recordings/{recording.pk}/").content.decode()


def close_and_process_recorded(recorder, recording: Recording) -> Recording:
    record_raw_call(recorder, recording.session_id, steps=5)
    return close_and_process(recording)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("[Errno 2] No such file: '/var/lib/parley/media/x.ogg'", "[Errno 2] No such file: '…/x.ogg'"),
        ('Could not connect to the endpoint URL: "http://127.0.0.1:9/b/k"', None),  # a URL is not a path
        ("chunk-000000.prc: bad crc", None),
    ],
)
def test_reasons_keep_no_absolute_path(text, shown):
    assert tasks.without_paths(text) == (shown or text)
