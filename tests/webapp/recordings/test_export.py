"""The evaluation set: three calls recorded through the recorder and post-processing, reviewed, exported (by the
list page's Celery task and by the management command), and loaded with ``datasets.load_dataset``.

The set must hold what the review pages show: the labelled spans, ratings and tags, the turn-taking and echo
figures, the configuration, and both audio tracks at the stored rate and length.
"""

from __future__ import annotations

import io
import json
import zipfile

import datasets
import numpy as np
import pytest
import soundfile as sf
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from webapp.recordings import annotations, services, sharing
from webapp.recordings.models import EvaluationExport, Label, Recording
from webapp.recordings.storage import recordings_storage

from .conftest import record_raw_call

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def three_calls(recorder, media_dir, make_recording, django_user_model, review_seed):
    owner = django_user_model.objects.create_user(username="owner", password="x")
    calls = []
    for i, steps in enumerate((20, 30, 40)):
        recording = make_recording(owner, session_id=f"sess_export{i}")
        record_raw_call(recorder, recording.session_id, steps=steps)
        services.recording_close(session_id=recording.session_id, reason="client_close")
        recording.refresh_from_db()
        assert recording.status == Recording.Status.READY, recording.status_reason
        Recording.objects.filter(pk=recording.pk).update(persona_name=f"Persona {i}", voice="calm", persona_version=2)
        recording.refresh_from_db()
        calls.append(recording)
    echo, slow = Label.objects.get(name="echo"), Label.objects.get(name="too slow")
    span = annotations.SpanRequest
    annotations.annotation_add(recording=calls[0], author=owner, span=span(echo.pk, 0.5, 1.2, "hears itself"))
    annotations.annotation_add(recording=calls[0], author=owner, span=span(slow.pk, 1.0, 1.5))
    annotations.rating_set(recording=calls[0], author=owner, stars=2)
    annotations.tag_add(recording=calls[0], user=owner, raw="Needs Work")
    annotations.rating_set(recording=calls[1], author=owner, stars=5)
    return owner, calls


def stored_tracks(recording: Recording) -> tuple[np.ndarray, int]:
    data, rate = sf.read(io.BytesIO(recordings_storage().open(recording.files["wav"]).read()), dtype="int16")
    return data, rate


def load(folder) -> datasets.Dataset:
    calls = datasets.load_dataset(str(folder), split="train", cache_dir=str(folder.parent / "hf-cache"))
    # datasets decodes Audio through torchcodec (CUDA-linked on PyPI); the bytes it holds are read here instead.
    for column in ("caller_audio", "agent_audio"):
        assert isinstance(calls.features[column], datasets.Audio)
        calls = calls.cast_column(column, datasets.Audio(decode=False))
    return calls


def check_set(calls: datasets.Dataset, folder, recordings: list[Recording]) -> None:
    assert calls.num_rows == len(recordings)
    rows = {row["session_id"]: row for row in calls}
    manifest = [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]
    assert {m["session_id"] for m in manifest} == set(rows)
    for recording in recordings:
        row = rows[recording.session_id]
        stereo, rate = stored_tracks(recording)
        assert abs(len(stereo) / rate - recording.duration_s) < 0.01
        for channel, column in enumerate(("caller_audio", "agent_audio")):
            audio, audio_rate = sf.read(io.BytesIO(row[column]["bytes"]), dtype="int16")
            assert audio_rate == rate == row["sampling_rate"], column
            assert len(audio) == len(stereo) == row["num_samples"], column
            assert np.array_equal(audio, stereo[:, channel]), column  # the very samples the page plays
            on_disk, _ = sf.read(folder / row[column]["path"], dtype="int16")
            assert np.array_equal(on_disk, audio)
        assert row["config"] == {
            "engine": "echo", "checkpoint": recording.checkpoint_name, "persona_id": None,
            "persona": recording.persona_name, "persona_version": 2, "voice": "calm",
        }  # fmt: skip
        lines = json.loads(recordings_storage().open(recording.files["transcript"]).read())["lines"]
        assert [line["text"] for line in row["transcript"]] == [line["text"] for line in lines]
        assert row["transcript"][0]["start_s"] == lines[0]["start"] and "Hello there." in lines[0]["text"]
        tt = recording.turn_taking
        assert json.loads(row["turn_taking_json"]) == tt and "error" not in tt
        assert row["metrics"]["overlap_s"] == tt["overlap_s"]
        assert row["metrics"]["caller_talk_s"] == tt["caller_talk_s"] > 0
        assert row["metrics"]["echo_flagged"] == recording.echo_leak["flagged"]
    first = rows["sess_export0"]
    assert [(a["label"], a["start_s"], a["end_s"], a["note"]) for a in first["annotations"]] == [
        ("echo", 0.5, 1.2, "hears itself"), ("too slow", 1.0, 1.5, ""),
    ]  # fmt: skip
    assert first["labels"] == ["echo", "too slow"] and first["tags"] == ["needs work"]
    assert first["ratings"] == [{"stars": 2, "author": "owner"}] and first["rating_mean"] == 2.0
    if "sess_export1" in rows:
        assert rows["sess_export1"]["rating_mean"] == 5.0 and rows["sess_export1"]["annotations"] == []
    if "sess_export2" in rows:
        assert rows["sess_export2"]["ratings"] == [] and rows["sess_export2"]["rating_mean"] is None


def test_the_list_pages_export_of_three_calls_loads_with_datasets(client, three_calls, tmp_path):
    owner, calls = three_calls
    client.force_login(owner)
    response = client.post(reverse("recording-export"), {"q": "", "engine": "echo"})
    assert response.status_code == 302
    job = EvaluationExport.objects.get(user=owner)
    assert (job.status, job.calls, job.progress) == (EvaluationExport.Status.READY, 3, 1.0)  # eager Celery
    status = client.get(reverse("recording-export-status", args=[job.pk])).json()
    assert status["status"] == "ready" and status["url"].endswith("evaluation-set.zip")
    archive = b"".join(client.get(status["url"]).streaming_content)
    folder = tmp_path / "unzipped"
    zipfile.ZipFile(io.BytesIO(archive)).extractall(folder)
    check_set(load(folder), folder, calls)
    # The list page shows the job with its download link.
    assert 'data-status="ready"' in client.get(reverse("recording-list")).content.decode()


def test_a_filtered_export_holds_only_the_matching_calls(client, three_calls, tmp_path):
    owner, calls = three_calls
    client.force_login(owner)
    client.post(reverse("recording-export"), {"label": "echo"})
    job = EvaluationExport.objects.get(user=owner)
    assert job.calls == 1
    folder = tmp_path / "by-label"
    zipfile.ZipFile(recordings_storage().open(job.file)).extractall(folder)
    check_set(load(folder), folder, [calls[0]])


def test_the_management_command_exports_what_the_user_may_see(three_calls, tmp_path, django_user_model, capsys):
    owner, calls = three_calls
    out = tmp_path / "cmd-set"
    call_command("exportevalset", str(out), "--user", "owner", "--filter", "min_rating=2", "--zip")
    assert "100%" in capsys.readouterr().out  # the progress bar reached the end
    check_set(load(out), out, calls[:2])
    assert zipfile.ZipFile(tmp_path / "cmd-set.zip").namelist()  # and the archive beside it
    # Another user sees none of them, until one is shared with them as a reviewer.
    stranger = django_user_model.objects.create_user(username="stranger", password="x")
    with pytest.raises(CommandError, match="nothing to export"):
        call_command("exportevalset", str(tmp_path / "none"), "--user", "stranger")
    stranger.groups.add(sharing.reviewers_group())
    sharing.share_create(recording=calls[2], by=owner, reviewer=stranger)
    shared = tmp_path / "shared-set"
    call_command("exportevalset", str(shared), "--user", "stranger")
    assert [row["session_id"] for row in load(shared)] == ["sess_export2"]


def test_bad_export_requests_are_refused_with_a_reason(client, three_calls, tmp_path):
    owner, _ = three_calls
    client.force_login(owner)
    page = client.post(reverse("recording-export"), {"min_rating": "seven"}, follow=True)
    assert "These filters are not valid" in page.content.decode()
    page = client.post(reverse("recording-export"), {"tag": "no such tag"}, follow=True)
    assert "nothing to export" in page.content.decode()
    assert not EvaluationExport.objects.exists()
    with pytest.raises(CommandError, match="KEY=VALUE"):
        call_command("exportevalset", str(tmp_path / "x"), "--user", "owner", "--filter", "oops")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(CommandError, match="not empty"):
        call_command("exportevalset", str(tmp_path / "full"), "--user", "owner")


def test_exports_are_purged_with_the_recordings_retention(client, three_calls, settings):
    from datetime import timedelta

    from django.utils import timezone

    from webapp.recordings import tasks

    owner, _ = three_calls
    client.force_login(owner)
    client.post(reverse("recording-export"), {})
    client.post(reverse("recording-export"), {"label": "echo"})
    old, fresh = EvaluationExport.objects.order_by("pk")
    assert recordings_storage().exists(old.file) and recordings_storage().exists(fresh.file)
    EvaluationExport.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=40))
    settings.PARLEY_RECORDING_RETENTION_DAYS = 30
    assert tasks.purge_recordings.delay().get() == 1  # the export (the calls themselves are recent)
    assert list(EvaluationExport.objects.values_list("pk", flat=True)) == [fresh.pk]
    assert not recordings_storage().exists(old.file) and recordings_storage().exists(fresh.file)
    assert client.get(reverse("recording-export-file", args=[old.pk])).status_code == 404
