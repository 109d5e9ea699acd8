"""Acceptance: recorded human speech streamed as the caller through a real call (the /v1/realtime consumer and the
in-process echo service) is transcribed by the embedded default in post-processing within the WER budget."""

from __future__ import annotations

import json

import jiwer
import pytest
from channels.db import database_sync_to_async

from tests.librivox import transcript
from tests.webapp.realtime.realtime_helpers import FRAME, make_account, ready_peer, to_pcm16
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

from .test_caller_transcript import MAX_MEAN_WER, SENTENCES, caller_track
from .test_consumer import wait_for_status

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def caller(raw_dir, media_dir, inference_service, settings):
    settings.PARLEY_TRANSCRIBER = "pocketsphinx"
    return await make_account("speaker")


@pytest.mark.timeout(300)
async def test_librivox_sentences_streamed_through_a_call_are_transcribed_within_the_budget(caller):
    peer, created = await ready_peer(caller)
    session_id = created["session"]["id"]
    await peer.prime()
    track, _starts = caller_track()
    await peer.stream(to_pcm16(track), chunk_bytes=FRAME * 2, lead=0)  # real time, like a microphone
    await peer.send({"type": "session.close"})
    await peer.until("session.closed")
    await wait_for_status(session_id, Recording.Status.READY, within_s=240.0)
    row = await database_sync_to_async(Recording.objects.get)(session_id=session_id)
    lines = json.loads(recordings_storage().open(row.files["transcript"]).read())["lines"]
    said = " ".join(line["text"] for line in lines if line.get("speaker") == "caller")
    references = [transcript(n) for n in SENTENCES]
    # One WER over the call: line breaks need not fall exactly between sentences after the live path.
    rate = jiwer.wer(" ".join(references), said)
    assert rate <= MAX_MEAN_WER, (rate, said)
    assert said.split()[0] in row.transcript_text  # the search text holds the caller's words
