"""session.update: personas and voices from the database, owner-scoped, reach the session."""

import pytest
from channels.db import database_sync_to_async

from tests.webapp.realtime.realtime_helpers import ready_peer
from webapp.personas.models import Persona, Voice

pytestmark = pytest.mark.django_db(transaction=True)


async def test_persona_id_and_voice_resolve_to_the_users_rows(alice):
    create_persona = database_sync_to_async(Persona.objects.create)
    shared = await create_persona(owner=None, name="Guide", instructions="You are a museum guide.")
    own = await create_persona(owner=alice.user, name="Mine", instructions="You are my assistant.")
    voice = await database_sync_to_async(Voice.objects.create)(owner=alice.user, name="low", status=Voice.Status.READY)
    peer, _ = await ready_peer(alice)

    await peer.send({"type": "session.update", "session": {"duplex": {"persona_id": shared.pk}}})
    session = (await peer.until("session.updated"))["session"]
    assert session["instructions"] == "You are a museum guide." and session["duplex"]["persona_id"] == shared.pk

    update = {"duplex": {"persona_id": str(own.pk)}, "audio": {"output": {"voice": str(voice.pk)}}}
    await peer.send({"type": "session.update", "session": update, "event_id": "u2"})
    session = (await peer.until("session.updated"))["session"]
    assert session["instructions"] == "You are my assistant."
    assert session["audio"]["output"]["voice"] == "low" and session["duplex"]["voice"] == "low"
    await peer.proves_alive()
    await peer.close()


async def test_unknown_session_fields_of_stock_clients_are_ignored(alice):
    peer, _ = await ready_peer(alice)
    stock = {
        "type": "realtime",
        "model": "gpt-realtime",
        "output_modalities": ["audio"],
        "instructions": "Hello.",
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": {"type": "server_vad"}}},
        "tools": [],
    }
    await peer.send({"type": "session.update", "session": stock})
    session = (await peer.until("session.updated"))["session"]
    assert session["instructions"] == "Hello."
    assert not any(isinstance(e, dict) and e["type"] == "error" for e in peer.seen)
    await peer.close()
