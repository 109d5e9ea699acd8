"""Finding 6: console actions and invites need explicit permissions, not just the staff flag."""

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import AsyncClient, Client

from inference import api
from inference.contracts import SessionRequest
from webapp.accounts.models import Invite

pytestmark = pytest.mark.django_db(transaction=True)


def staff_user(username: str, *perms: str):
    user = get_user_model().objects.create_user(username=username, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=perms))
    return user


async def test_staff_without_the_permission_cannot_end_a_session(inference_service):
    handle = await api.open_session(SessionRequest(user_key="victim"))
    session_id = None
    async for event in handle.events():  # Ready carries the session id
        session_id = getattr(event, "session_id", None)
        if session_id:
            break
    plain_staff, operator = AsyncClient(), AsyncClient()
    await plain_staff.aforce_login(await sync_to_async(staff_user)("watcher"))
    await operator.aforce_login(await sync_to_async(staff_user)("operator", "end_session"))

    assert (await plain_staff.get("/ops/occupancy.json")).status_code == 200  # staff may look
    refused = await plain_staff.post(f"/ops/sessions/{session_id}/end/")
    assert refused.status_code == 403
    assert [s.session_id for worker in await api.occupancy() for s in worker.slots if s.session_id] == [session_id]

    assert (await operator.post(f"/ops/sessions/{session_id}/end/")).status_code == 302
    closed = [event async for event in handle.events()]
    assert closed[-1].reason == "admin_ended"


def test_staff_without_the_permission_cannot_mint_invites():
    client = Client()
    client.force_login(staff_user("watcher"))
    assert client.get("/accounts/invites/").status_code == 403
    assert client.post("/accounts/invites/", {"note": "for eve"}).status_code == 403
    assert not Invite.objects.exists()

    client.force_login(staff_user("inviter", "add_invite"))
    client.post("/accounts/invites/", {"note": "for dave"})
    assert Invite.objects.filter(note="for dave").exists()
