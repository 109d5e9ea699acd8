"""The official ``openai`` SDK selects a Parley voice by name or by id; another user's private voice is refused."""

import pytest
from django.contrib.auth import get_user_model
from openai import OpenAI

from webapp.accounts.services import apikey_create
from webapp.personas.models import Voice

pytestmark = pytest.mark.django_db(transaction=True)


def next_event(connection, *types: str, limit: int = 500):
    for _ in range(limit):
        event = connection.recv()
        if event.type in types:
            return event
    raise AssertionError(f"none of {types} within {limit} events")


def test_openai_sdk_picks_a_voice_by_name_or_id(channels_live_server):
    users = get_user_model().objects
    me, other = users.create_user("sdk-voices"), users.create_user("sdk-other")
    mine = Voice.objects.create(owner=me, name="warm", status=Voice.Status.READY)
    Voice.objects.create(owner=me, name="cool", status=Voice.Status.READY)
    Voice.objects.create(owner=other, name="private", status=Voice.Status.READY)
    _, key = apikey_create(user=me, name="sdk voices")
    client = OpenAI(
        api_key=key, base_url=f"{channels_live_server.url}/v1", websocket_base_url=f"{channels_live_server.ws_url}/v1"
    )
    with client.realtime.connect(model="echo") as connection:
        next_event(connection, "session.created")
        connection.session.update(session={"type": "realtime", "audio": {"output": {"voice": "private"}}})
        error = next_event(connection, "error", "session.updated")
        assert error.type == "error" and error.error.code == "voice_not_found"

        connection.session.update(session={"type": "realtime", "audio": {"output": {"voice": "cool"}}})
        assert next_event(connection, "session.updated", "error").session.audio.output.voice == "cool"
        connection.session.update(session={"type": "realtime", "audio": {"output": {"voice": str(mine.pk)}}})
        updated = next_event(connection, "session.updated", "error")
        assert updated.type == "session.updated" and updated.session.audio.output.voice == "warm"
        connection.send({"type": "session.close"})
