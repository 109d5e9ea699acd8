"""The occupancy views against the real in-process inference service (echo engine)."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import AsyncClient

from inference import api
from inference.contracts import Closed, Ready, SessionRequest

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def echo_service(inference_service):
    """The shared echo service (tests/conftest.py), restarted with two slots."""
    await inference_service(slots=2, echo_prefill_ticks=0)


async def make_user(username: str, *, staff: bool = False, perms: tuple[str, ...] = ()):
    @sync_to_async
    def create():
        user = get_user_model().objects.create_user(username=username, password="pw", is_staff=staff)
        user.user_permissions.add(*Permission.objects.filter(codename__in=perms))
        return user

    return await create()


async def logged_in(user) -> AsyncClient:
    client = AsyncClient()
    await client.aforce_login(user)
    return client


async def next_event(handle, kind, wait_s: float = 5.0):
    async def first():
        async for event in handle.events():
            if isinstance(event, kind):
                return event
        raise AssertionError(f"the session ended without a {kind.__name__} event")

    return await asyncio.wait_for(first(), wait_s)


async def test_operations_are_staff_only(echo_service):
    anonymous = AsyncClient()
    assert (await anonymous.get("/ops/occupancy.json")).status_code == 401
    page = await anonymous.get("/ops/")
    assert page.status_code == 302 and "/accounts/login/" in page["Location"]
    plain = await logged_in(await make_user("plain"))
    for path in ("/ops/", "/ops/workers/", "/ops/occupancy.json"):
        assert (await plain.get(path)).status_code == 403, path
    assert (await plain.post("/ops/sessions/sess_x/end/")).status_code == 403


async def test_occupancy_shows_a_live_session_and_the_end_button_ends_it(echo_service):
    caller = await make_user("caller")
    staff = await logged_in(await make_user("boss", staff=True, perms=("end_session",)))
    handle = await api.open_session(SessionRequest(user_key=str(caller.pk)))
    ready = await next_event(handle, Ready)

    document = (await staff.get("/ops/occupancy.json")).json()
    assert document["session_ids"] == [ready.session_id]
    assert document["busy_slots"] == 1 and document["total_slots"] == 2
    assert document["workers"][0]["engine"] == "echo"
    for path in ("/ops/", "/ops/workers/"):
        html = (await staff.get(path)).content.decode()
        assert f'data-session-id="{ready.session_id}"' in html
        assert "caller" in html  # the slot names its user
        assert f"/ops/sessions/{ready.session_id}/end/" in html

    response = await staff.post(f"/ops/sessions/{ready.session_id}/end/")
    assert response.status_code == 302
    closed = await next_event(handle, Closed)
    assert closed.reason == "admin_ended"
    for _ in range(50):  # the slot is free once the engine confirmed cleanup
        if not (await staff.get("/ops/occupancy.json")).json()["session_ids"]:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the slot was not freed")


async def test_ending_unknown_or_malformed_sessions_is_a_message_not_an_error(echo_service):
    staff = await logged_in(await make_user("boss2", staff=True, perms=("end_session",)))
    for session_id in ("sess_gone", "bad%20id"):
        response = await staff.post(f"/ops/sessions/{session_id}/end/", follow=True)
        assert response.status_code == 200
        assert any(word in response.content.decode() for word in ("not running", "not a session id"))
    assert (await staff.get("/ops/sessions/sess_gone/end/")).status_code == 405


@pytest.fixture
async def unreachable_service(tmp_path):
    await api.start(inference_url=f"unix://{tmp_path}/nobody-listens.sock")
    yield
    await api.shutdown()


async def test_pages_say_when_the_inference_service_is_unreachable(unreachable_service):
    user = await make_user("boss3", staff=True, perms=("end_session",))
    staff = await logged_in(user)
    response = await staff.get("/ops/occupancy.json")
    assert response.status_code == 503
    assert response.json()["error"]["message"]
    page = await staff.get("/ops/")
    assert page.status_code == 200 and "not reachable" in page.content.decode()
    ended = await staff.post("/ops/sessions/sess_x/end/", follow=True)
    assert "Could not end session" in ended.content.decode()
    call_page = await staff.get("/")
    assert call_page.status_code == 200 and "not reachable" in call_page.content.decode()
