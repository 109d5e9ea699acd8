"""Staff status alone grants nothing over other users' data: each act names its permission, and every path to
it (pages, console, realtime, the SDK on a real daphne) asks the same ``webapp.accounts.permissions.may``.

Each test runs the act as a staff user without the permission (refused, nothing changed), then with it
(allowed). The owner is always a plain user, ``alice``.
"""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone
from openai import OpenAI

from tests.webapp.realtime.realtime_helpers import make_account, ready_peer
from webapp.accounts.services import apikey_create
from webapp.personas.models import Persona, PersonaVersion, Voice
from webapp.recordings import storage
from webapp.recordings.models import Recording

pytestmark = pytest.mark.django_db(transaction=True)


def grant(user, *codenames: str):
    """``user`` with these permissions (``app.codename``), read afresh so that Django's permission cache is too."""
    for name in codenames:
        app, codename = name.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return get_user_model().objects.get(pk=user.pk)


def staff(username: str, *codenames: str):
    return grant(get_user_model().objects.create_user(username=username, password="pw", is_staff=True), *codenames)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def alice():
    return get_user_model().objects.create_user(username="alice", password="pw")


# ---- recordings: see and download, delete ------------------------------------------------------------------


@pytest.fixture
def alices_recording(alice, tmp_path, settings):
    settings.STORAGES = {
        **settings.STORAGES,
        "recordings": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": tmp_path}},
    }
    name = storage.save(storage.file_name(user_id=alice.pk, session_id="sess_alice", filename="stereo.wav"), b"RIFF")
    return Recording.objects.create(
        user=alice, session_id="sess_alice", engine="echo", started_at=timezone.now(),
        status=Recording.Status.READY, files={"wav": name}, transcript_text="alice's words",
    )  # fmt: skip


def recording_reads(pk: int) -> list[str]:
    return [f"/recordings/{pk}/", f"/recordings/{pk}/status.json", f"/recordings/{pk}/files/wav",
            f"/recordings/{pk}/download.zip"]  # fmt: skip


def test_seeing_and_downloading_another_users_recording_takes_view_recording(alices_recording):
    plain = logged_in(staff("plainstaff"))
    for url in recording_reads(alices_recording.pk):
        assert plain.get(url).status_code == 404, url
    assert f'href="/recordings/{alices_recording.pk}/"' not in plain.get("/recordings/").content.decode()

    viewer = logged_in(staff("viewer", "recordings.view_recording"))
    for url in recording_reads(alices_recording.pk):
        assert viewer.get(url).status_code == 200, url
    assert f'href="/recordings/{alices_recording.pk}/"' in viewer.get("/recordings/").content.decode()


def test_deleting_another_users_recording_takes_delete_recording(alices_recording):
    url = f"/recordings/{alices_recording.pk}/delete"
    assert logged_in(staff("plainstaff")).post(url).status_code == 404
    assert logged_in(staff("viewer", "recordings.view_recording")).post(url).status_code == 403
    assert Recording.objects.filter(pk=alices_recording.pk).exists()
    remover = logged_in(staff("remover", "recordings.view_recording", "recordings.delete_recording"))
    assert remover.post(url).status_code == 302
    assert not Recording.objects.filter(pk=alices_recording.pk).exists()


def test_the_owner_needs_no_permission_for_their_own_recording(alice, alices_recording):
    owner = logged_in(alice)
    for url in recording_reads(alices_recording.pk):
        assert owner.get(url).status_code == 200, url
    assert owner.post(f"/recordings/{alices_recording.pk}/delete").status_code == 302


# ---- personas: see, edit ------------------------------------------------------------------------------------


def test_editing_another_users_private_persona_takes_view_and_change_persona(alice):
    persona = Persona.objects.create(owner=alice, name="Alice's", instructions="Only for Alice.")
    edit = f"/personas/{persona.pk}/edit/"
    form = {"name": "Taken", "instructions": "staff words"}
    assert logged_in(staff("plainstaff")).post(edit, form).status_code == 404
    assert logged_in(staff("plainstaff2")).get(f"/personas/{persona.pk}/versions/").status_code == 404
    looker = logged_in(staff("looker", "personas.view_persona"))
    assert looker.get(f"/personas/{persona.pk}/versions/").status_code == 200
    assert looker.post(edit, form).status_code == 403
    assert looker.post(f"/personas/{persona.pk}/archive/", {"archived": "1"}).status_code == 403
    persona.refresh_from_db()
    assert (persona.instructions, persona.version, persona.archived) == ("Only for Alice.", 1, False)
    assert PersonaVersion.objects.filter(persona=persona).count() == 1  # no new version appeared

    editor = logged_in(staff("editor", "personas.view_persona", "personas.change_persona"))
    assert editor.post(edit, form).status_code == 302
    persona.refresh_from_db()
    assert persona.instructions == "staff words" and persona.version == 2 and persona.owner == alice


def test_editing_a_shared_persona_takes_change_persona():
    shared = Persona.objects.create(owner=None, name="Shared", instructions="for all")
    form = {"name": "Shared", "instructions": "changed", "shared": "on"}
    assert logged_in(staff("plainstaff")).post(f"/personas/{shared.pk}/edit/", form).status_code == 403
    assert (
        logged_in(staff("editor", "personas.change_persona")).post(f"/personas/{shared.pk}/edit/", form).status_code
        == 302
    )
    shared.refresh_from_db()
    assert shared.instructions == "changed" and shared.owner is None


# ---- voices: see, disable (page and console alike) ----------------------------------------------------------


def test_seeing_another_users_private_voice_takes_view_voice(alice):
    voice = Voice.objects.create(owner=alice, name="alice-voice", status=Voice.Status.READY)
    plain = logged_in(staff("plainstaff"))
    assert plain.get(f"/voices/{voice.pk}/").status_code == 404
    assert "alice-voice" not in plain.get("/voices/").content.decode()
    looker = logged_in(staff("looker", "personas.view_voice"))
    assert looker.get(f"/voices/{voice.pk}/").status_code == 200
    assert "alice-voice" in looker.get("/voices/").content.decode()


@pytest.mark.parametrize("path", ["/voices/{pk}/disable/", "/ops/console/voices/{pk}/disable/"])
def test_disabling_a_voice_takes_disable_voice_on_the_page_as_in_the_console(alice, path):
    voice = Voice.objects.create(owner=None, name="shared-voice", status=Voice.Status.READY)
    url, form = path.format(pk=voice.pk), {"confirm": str(voice.pk)}  # the console asks for a confirmation
    assert logged_in(staff("plainstaff")).post(url, form).status_code == 403
    assert (
        logged_in(staff("allseeing", "personas.view_voice", "personas.change_voice")).post(url, form).status_code == 403
    )
    voice.refresh_from_db()
    assert voice.status == Voice.Status.READY
    operator = staff("operator", "operations.disable_voice")
    assert logged_in(operator).post(url, form).status_code in (200, 302)
    voice.refresh_from_db()
    assert voice.status == Voice.Status.DISABLED and voice.disabled_by == operator


# ---- realtime: another user's private voice and persona in session.update -----------------------------------


async def test_realtime_use_of_another_users_private_voice_and_persona_takes_the_permissions(inference_service):
    alice, boss = await make_account("alice"), await make_account("boss")
    await database_sync_to_async(get_user_model().objects.filter(pk=boss.user.pk).update)(is_staff=True)
    voice = await database_sync_to_async(Voice.objects.create)(owner=alice.user, name="alices", status="ready")
    persona = await database_sync_to_async(Persona.objects.create)(owner=alice.user, name="P", instructions="secret")
    voice_update = {"type": "session.update", "session": {"audio": {"output": {"voice": voice.pk}}}}
    persona_update = {"type": "session.update", "session": {"duplex": {"persona_id": persona.pk}}}
    peer, _ = await ready_peer(boss)
    await peer.send(voice_update)
    assert (await peer.until("error"))["error"]["code"] == "voice_not_found"
    await peer.send(persona_update)
    assert (await peer.until("error"))["error"]["code"] == "persona_not_found"
    # Granted while the call runs: each update reads the user afresh, so the next one is allowed.
    await database_sync_to_async(grant)(boss.user, "personas.use_any_voice", "personas.view_persona")
    await peer.send(voice_update)
    assert (await peer.until("session.updated"))["session"]["duplex"]["voice_id"] == voice.pk
    await peer.send(persona_update)
    assert (await peer.until("session.updated"))["session"]["instructions"] == "secret"
    await peer.close()


def test_the_sdk_on_a_real_server_is_refused_another_users_voice_until_granted(channels_live_server, alice):
    voice = Voice.objects.create(owner=alice, name="alices-private", status=Voice.Status.READY)
    boss = staff("sdkboss")
    _, key = apikey_create(user=boss, name="sdk")
    client = OpenAI(
        api_key=key, base_url=f"{channels_live_server.url}/v1", websocket_base_url=f"{channels_live_server.ws_url}/v1"
    )
    with client.realtime.connect(model="echo") as connection:
        next_event(connection, "session.created")
        for ref in (str(voice.pk), "alices-private"):
            connection.session.update(session={"type": "realtime", "audio": {"output": {"voice": ref}}})
            error = next_event(connection, "error", "session.updated")
            assert error.type == "error" and error.error.code == "voice_not_found", ref
        grant(boss, "personas.use_any_voice")
        connection.session.update(session={"type": "realtime", "audio": {"output": {"voice": str(voice.pk)}}})
        updated = next_event(connection, "session.updated", "error")
        assert updated.type == "session.updated" and updated.session.audio.output.voice == "alices-private"
        connection.send({"type": "session.close"})


def next_event(connection, *types: str, limit: int = 500):
    for _ in range(limit):
        event = connection.recv()
        if event.type in types:
            return event
    raise AssertionError(f"none of {types} within {limit} events")
