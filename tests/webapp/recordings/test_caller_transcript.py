"""Post-processing transcribes the caller's track (recorded human speech here) into the review transcript and search."""

from __future__ import annotations

import json

import jiwer
import numpy as np
import pytest
from django.urls import reverse
from scipy.signal import resample_poly

from inference.engines.base import SlotOutput
from inference.recording.chunks import folder_state
from inference.recording.recorder import record_steps
from tests.librivox import sentence, transcript
from webapp.recordings import services
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

from .conftest import CHUNK, META, RATE, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SENTENCES = ("0870", "0890", "0920")
MAX_MEAN_WER = 0.35
AGENT_WORDS = ["Tell", " me", " more."]


def caller_track() -> tuple[np.ndarray, list[float]]:
    """The three LibriVox sentences at the call's rate with 1.5 s of quiet between, and where each starts."""
    quiet = np.zeros(int(1.5 * RATE), np.float32)
    parts, starts, at = [quiet], [], len(quiet)
    for number in SENTENCES:
        samples, rate = sentence(number)
        speech = resample_poly(samples.astype(np.float32) / 32768.0, RATE // 8000, rate // 8000).astype(np.float32)
        starts.append(at / RATE)
        parts += [speech, quiet]
        at += len(speech) + len(quiet)
    track = np.concatenate(parts)
    return np.concatenate([track, np.zeros(-len(track) % CHUNK, np.float32)]), starts


def record_call_with_speech(recorder, session_id: str) -> list[float]:
    track, starts = caller_track()
    recording = recorder.begin(session_id, META)
    silence = np.zeros(CHUNK, "<i2").tobytes()
    items = []
    for step in range(len(track) // CHUNK):
        text = AGENT_WORDS[step] if step < len(AGENT_WORDS) else ""
        caller = track[step * CHUNK : (step + 1) * CHUNK]
        items.append(recording.step_item(caller, silence, SlotOutput(audio=np.zeros(0), text=text), 2.0))
    record_steps(items)  # one queue item: the writer cannot fall behind
    recording.finish("client_close")
    wait_for(lambda: folder_state(recorder.root / session_id) == "finished")
    return starts


def test_the_callers_words_are_transcribed_timed_and_searchable(
    client, recorder, media_dir, make_recording, django_user_model, settings
):
    settings.PARLEY_TRANSCRIBER = "pocketsphinx"
    owner = django_user_model.objects.create_user(username="owner", password="x")
    recording = make_recording(owner, session_id="sess_spoken")
    starts = record_call_with_speech(recorder, "sess_spoken")
    services.recording_close(session_id="sess_spoken", reason="client_close")
    recording.refresh_from_db()
    assert recording.status == Recording.Status.READY, recording.status_reason

    lines = json.loads(recordings_storage().open(recording.files["transcript"]).read())["lines"]
    caller = [line for line in lines if line.get("speaker") == "caller"]
    agent = [line for line in lines if "speaker" not in line]
    assert [line["text"] for line in agent] == ["Tell me more."]  # the agent's side is kept, unlabelled as before
    assert [line["start"] for line in lines] == sorted(line["start"] for line in lines)
    assert len(caller) == len(SENTENCES)  # one line per sentence: the quiet between them splits lines
    for line, start in zip(caller, starts, strict=True):
        assert line["start"] == pytest.approx(start, abs=0.5)  # timed on the call's clock
        assert all(line["start"] <= w[1] < w[2] <= line["end"] for w in line["words"])
    rates = [jiwer.wer(transcript(n), line["text"]) for n, line in zip(SENTENCES, caller, strict=True)]
    assert sum(rates) / len(rates) <= MAX_MEAN_WER, (rates, [line["text"] for line in caller])

    client.force_login(owner)
    heard = {w[0] for line in caller for w in line["words"]}
    reference = set(" ".join(transcript(n) for n in SENTENCES).split())
    word = next(w for w in sorted(heard & reference, key=len, reverse=True))  # a word the caller really said

    def found(q: str) -> int:
        return client.get(reverse("recording-list"), {"q": q}).content.decode().count("data-recording=")

    assert found(word) == 1 and found("tell me more") == 1 and found("zeppelin") == 0


def test_a_failing_transcriber_leaves_the_agents_transcript_and_a_playable_recording(
    recorder, media_dir, make_recording, settings
):
    settings.PARLEY_TRANSCRIBER = "whisper"  # with no weights set: a TranscriptionError in post-processing
    recording = make_recording(session_id="sess_no_asr")
    record_call_with_speech(recorder, "sess_no_asr")
    services.recording_close(session_id="sess_no_asr", reason="client_close")
    recording.refresh_from_db()
    assert recording.status == Recording.Status.READY and recording.playable
    lines = json.loads(recordings_storage().open(recording.files["transcript"]).read())["lines"]
    assert [line["text"] for line in lines] == ["Tell me more."]
