"""The realtime ``session.update`` path: only the owner (and staff granted the permission) may use a private
persona or voice; a voice
that is not ready (pending, failed, disabled) starts no call; the session's capabilities name the persona
version and the voice it runs with."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from tests.webapp.realtime.realtime_helpers import make_account, ready_peer
from webapp.personas.models import Persona, Voice

pytestmark = pytest.mark.django_db(transaction=True)


async def rejected(peer, event: dict) -> dict:
    await peer.send(event)
    return (await peer.until("error"))["error"]


def persona_update(persona_id) -> dict:
    return {"type": "session.update", "session": {"duplex": {"persona_id": persona_id}}}


def voice_update(voice) -> dict:
    return {"type": "session.update", "session": {"audio": {"output": {"voice": voice}}}}


async def test_private_rows_of_another_user_cannot_be_used(inference_service):
    alice, bob = await make_account("alice"), await make_account("bob")
    create_persona = database_sync_to_async(Persona.objects.create)
    create_voice = database_sync_to_async(Voice.objects.create)
    private = await create_persona(owner=alice.user, name="Alice's", instructions="Only for Alice.")
    voice = await create_voice(owner=alice.user, name="alice-voice", status=Voice.Status.READY)
    peer, _ = await ready_peer(bob)
    error = await rejected(peer, persona_update(private.pk))
    assert error["code"] == "persona_not_found"
    for ref in (voice.pk, str(voice.pk), "alice-voice"):  # by id or by name
        assert (await rejected(peer, voice_update(ref)))["code"] == "voice_not_found"
    await peer.proves_alive()
    await peer.close()


async def test_voices_that_are_not_ready_start_no_call(inference_service):
    alice = await make_account("alice")
    create_voice = database_sync_to_async(Voice.objects.create)
    for status in (Voice.Status.PENDING, Voice.Status.PROCESSING, Voice.Status.FAILED, Voice.Status.DISABLED):
        await create_voice(owner=alice.user, name=f"v-{status}", status=status)
    peer, _ = await ready_peer(alice)
    for status in ("pending", "processing", "failed", "disabled"):
        assert (await rejected(peer, voice_update(f"v-{status}")))["code"] == "voice_not_found"
    await peer.close()


async def test_capabilities_name_the_persona_version_and_the_voice(inference_service):
    alice = await make_account("alice")
    persona = await database_sync_to_async(Persona.objects.create)(owner=alice.user, name="P", instructions="v1 text")
    persona.instructions = "v2 text"
    await database_sync_to_async(persona.save)()
    voice = await database_sync_to_async(Voice.objects.create)(owner=alice.user, name="mine", status=Voice.Status.READY)
    peer, _ = await ready_peer(alice)
    update = {"instructions": "v2 text", "duplex": {"persona_id": persona.pk}, "audio": {"output": {"voice": "mine"}}}
    await peer.send({"type": "session.update", "session": update})
    session = (await peer.until("session.updated"))["session"]
    caps = session["duplex"]["capabilities"]
    assert caps["persona"] == {"id": persona.pk, "version": 2}
    assert caps["voice"] == {"id": voice.pk, "name": "mine"}
    assert session["duplex"]["persona_version"] == 2 and session["duplex"]["voice_id"] == voice.pk
    assert session["instructions"] == "v2 text"
    # a stock client resending the same instructions keeps the persona reference
    await peer.send({"type": "session.update", "session": {"instructions": "v2 text"}})
    caps = (await peer.until("session.updated"))["session"]["duplex"]["capabilities"]
    assert caps["persona"] == {"id": persona.pk, "version": 2}
    await peer.close()


async def test_staff_may_use_any_voice_only_with_use_any_voice(inference_service):
    from django.contrib.auth.models import Permission

    alice, boss = await make_account("alice"), await make_account("boss")
    boss.user.is_staff = True
    await database_sync_to_async(boss.user.save)()
    voice = await database_sync_to_async(Voice.objects.create)(
        owner=alice.user, name="alices", status=Voice.Status.READY
    )
    peer, _ = await ready_peer(boss)
    assert (await rejected(peer, voice_update(voice.pk)))["code"] == "voice_not_found"  # staff alone: no
    permission = await database_sync_to_async(Permission.objects.get)(codename="use_any_voice")
    await database_sync_to_async(boss.user.user_permissions.add)(permission)
    await peer.send(voice_update(voice.pk))
    assert (await peer.until("session.updated"))["session"]["duplex"]["voice_id"] == voice.pk
    await peer.close()
