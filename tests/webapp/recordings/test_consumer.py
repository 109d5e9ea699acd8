"""Through the real /v1/realtime consumer and the in-process service: the catalogue row follows
``session.duplex.record``, and a closed call is post-processed (eagerly, the embedded default)."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async

from tests.webapp.realtime.realtime_helpers import FRAME, make_account, ready_peer, to_pcm16, tone
from webapp.recordings.models import Recording

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def caller(raw_dir, media_dir, inference_service):
    """A user with an API key; the echo service records into ``raw_dir`` (set before it started)."""
    return await make_account("recorded")


async def status_of(session_id: str) -> str | None:
    row = await database_sync_to_async(Recording.objects.filter(session_id=session_id).first)()
    return None if row is None else row.status


async def wait_for_status(session_id: str, status: str, within_s: float = 20.0) -> None:
    for _ in range(int(within_s / 0.1)):
        if await status_of(session_id) == status:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{session_id} is {await status_of(session_id)}, not {status}")


async def test_a_call_is_catalogued_while_live_and_ready_after_it_closes(caller, raw_dir):
    peer, created = await ready_peer(caller)
    session = created["session"]
    assert session["duplex"]["record"] is True
    assert session["duplex"]["capabilities"]["record_policy"] == "auto"
    await wait_for_status(session["id"], Recording.Status.RECORDING)  # written just after session.created
    await peer.prime()
    await peer.stream(to_pcm16(tone(FRAME * 12)), chunk_bytes=FRAME * 2)
    await peer.send({"type": "session.close"})
    await peer.until("session.closed")
    await wait_for_status(session["id"], Recording.Status.READY)
    row = await database_sync_to_async(Recording.objects.get)(session_id=session["id"])
    assert row.status == Recording.Status.READY, row.status_reason
    assert row.close_reason == "client_close" and row.duration_s >= 12 * 0.08
    assert not (raw_dir / session["id"]).exists()


async def test_duplex_record_false_before_audio_means_no_recording(caller, raw_dir):
    peer, created = await ready_peer(caller)
    session_id = created["session"]["id"]
    await peer.send({"type": "session.update", "session": {"duplex": {"record": False}}})
    assert (await peer.until("session.updated"))["session"]["duplex"]["record"] is False
    assert await status_of(session_id) is None
    await peer.prime()
    # Turning it back on once audio runs is refused: the recording covers a whole call or none of it.
    await peer.send({"type": "session.update", "session": {"duplex": {"record": True}}, "event_id": "r1"})
    error = await peer.error()
    assert error["code"] == "record_update_unsupported" and error["event_id"] == "r1"
    await peer.proves_alive()
    await peer.send({"type": "session.close"})
    await peer.until("session.closed")
    assert not (raw_dir / session_id).exists() and await status_of(session_id) is None


async def test_a_call_closed_before_any_audio_leaves_no_recording(caller, raw_dir):
    """Nothing was recorded: the row goes, rather than a recording post-processing would fail as missing."""
    peer, created = await ready_peer(caller)
    session_id = created["session"]["id"]
    await wait_for_status(session_id, Recording.Status.RECORDING)  # catalogued while the call could start
    await peer.send({"type": "session.close"})
    await peer.until("session.closed")
    for _ in range(100):  # the close is handled in a task of its own, after session.closed is sent
        if await status_of(session_id) is None:
            break
        await asyncio.sleep(0.05)
    assert await status_of(session_id) is None
    assert not (raw_dir / session_id).exists()


async def test_the_recording_names_the_persona_version_and_voice_chosen_by_session_update(caller):
    """The row is made at session.created, before the client chose anything: session.update's choice reaches it."""
    from webapp.personas.models import Persona, Voice

    voice = await database_sync_to_async(Voice.objects.create)(
        owner=caller.user, name="Calm narrator", status=Voice.Status.READY
    )
    persona = await database_sync_to_async(Persona.objects.create)(
        owner=caller.user, name="Museum guide", instructions="You are a calm museum guide."
    )
    peer, created = await ready_peer(caller)
    session_id = created["session"]["id"]
    await wait_for_status(session_id, Recording.Status.RECORDING)
    update = {"duplex": {"persona_id": persona.pk}, "audio": {"output": {"voice": voice.pk}}}
    await peer.send({"type": "session.update", "session": update})
    duplex = (await peer.until("session.updated"))["session"]["duplex"]
    assert (duplex["persona_name"], duplex["persona_version"], duplex["voice"]) == ("Museum guide", 1, "Calm narrator")
    row = await database_sync_to_async(Recording.objects.get)(session_id=session_id)
    assert (row.persona_id, row.persona_name, row.persona_version) == (persona.pk, "Museum guide", 1)
    assert row.voice == "Calm narrator"
    await peer.send({"type": "session.close"})
    await peer.until("session.closed")
