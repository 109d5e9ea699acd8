"""The operations console against the real in-process echo service: page, live socket, actions, audit, metrics."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import AsyncClient

from inference import api
from inference.contracts import Closed, Ready, SessionRequest
from webapp.accounts.services import apikey_create, apikey_revoke
from webapp.asgi import application
from webapp.operations.models import AuditEntry

pytestmark = pytest.mark.django_db(transaction=True)

ALL_CONSOLE_PERMS = ("view_console", "end_session", "drain_service", "control_admission", "disable_voice")
TINY_PERSONAPLEX = Path(__file__).resolve().parents[2] / "data" / "personaplex" / "ckpt"
FRAME = np.full(1920, 1000, dtype="<i2").tobytes()  # 80 ms at 24 kHz


@pytest.fixture
async def echo_service(inference_service):
    await inference_service(slots=2, queue_max=2, echo_prefill_ticks=0)


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


async def console_socket(client: AsyncClient) -> WebsocketCommunicator:
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    headers = [(b"cookie", cookie.encode()), (b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1")]
    return WebsocketCommunicator(application, "/ops/live", headers=headers)


async def key_console_socket(raw_key: str) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {raw_key}".encode()), (b"host", b"127.0.0.1")]
    return WebsocketCommunicator(application, "/ops/live", headers=headers)


async def close_code(socket: WebsocketCommunicator, wait_s: float = 3.0) -> int:
    """The code the server closes ``socket`` with (snapshots pushed before it are skipped)."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        assert remaining > 0, "the console was not closed in time"
        message = await socket.receive_output(timeout=remaining)
        if message["type"] == "websocket.close":
            return message["code"]
        assert message["type"] == "websocket.send", message


async def snapshot_where(socket: WebsocketCommunicator, predicate, wait_s: float = 5.0) -> dict:
    """The first pushed snapshot that satisfies ``predicate``."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        assert remaining > 0, "no snapshot matched in time"
        snapshot = json.loads(await socket.receive_from(timeout=remaining))
        if predicate(snapshot):
            return snapshot


async def next_event(handle, kind, wait_s: float = 5.0):
    async def first():
        async for event in handle.events():
            if isinstance(event, kind):
                return event
        raise AssertionError(f"no {kind.__name__}")

    return await asyncio.wait_for(first(), wait_s)


async def test_non_staff_get_403_for_page_socket_actions_and_metrics(echo_service):
    for user in (await make_user("plain"), await make_user("staff_without_perms", staff=True)):
        client = await logged_in(user)
        assert (await client.get("/ops/console/")).status_code == 403
        assert (await client.get("/ops/metrics")).status_code == 403
        for path in (
            "/ops/console/sessions/sess_x/end/",
            "/ops/console/services/in-process/drain/",
            "/ops/console/admission/",
            "/ops/console/voices/1/disable/",
        ):
            assert (await client.post(path, {"confirm": "x"})).status_code == 403, path
        socket = await console_socket(client)
        connected, _ = await socket.connect()
        assert not connected  # closed before accept: daphne answers the handshake with HTTP 403
    assert await AuditEntry.objects.acount() == 0


async def test_console_pushes_a_live_session_and_ending_it_is_confirmed_and_audited(echo_service):
    caller = await make_user("caller")
    boss = await make_user("boss", staff=True, perms=ALL_CONSOLE_PERMS)
    staff = await logged_in(boss)
    page = await staff.get("/ops/console/")
    assert page.status_code == 200 and b'id="console-snapshot"' in page.content

    socket = await console_socket(staff)
    assert (await socket.connect())[0]
    handle = await api.open_session(SessionRequest(user_key=str(caller.pk), persona="A patient tutor", record=False))
    ready = await next_event(handle, Ready)
    for _ in range(12):
        await handle.append_audio(FRAME, encoding="pcm16", rate=24000)
        await asyncio.sleep(0.08)

    def has_frames(snapshot):
        rows = [s for s in snapshot["sessions"] if s["session_id"] == ready.session_id]
        return rows and rows[0]["frames_in"] >= 5 and rows[0]["frames_out"] >= 1

    snapshot = await snapshot_where(socket, has_frames)
    row = next(s for s in snapshot["sessions"] if s["session_id"] == ready.session_id)
    assert row["username"] == "caller" and row["state"] == "active" and row["engine"] == "echo"
    assert row["persona"] == "A patient tutor" and row["record"] is False
    (service,) = snapshot["services"]
    assert service["service_id"] == "in-process" and service["state"] == "serving"
    assert service["slots_used"] == 1 and service["slots_total"] == 2 and service["history"]

    url = f"/ops/console/sessions/{ready.session_id}/end/"
    unconfirmed = await staff.post(url)
    assert unconfirmed.status_code == 400  # no confirmation: nothing happens
    assert (await asyncio.wait_for(anext(handle.events()), 0.5)) is not None  # still streaming
    reply = await staff.post(url, {"confirm": ready.session_id})
    assert reply.status_code == 200 and reply.json()["outcome"] == "ended"
    assert (await next_event(handle, Closed)).reason == "admin_ended"
    entry = await AuditEntry.objects.select_related("actor").aget()
    assert (entry.actor.username, entry.action, entry.target) == ("boss", "end_session", ready.session_id)

    await snapshot_where(socket, lambda s: not any(r["session_id"] == ready.session_id for r in s["sessions"]))
    await socket.disconnect()


async def test_stop_admitting_refuses_new_calls_but_keeps_live_ones_and_drain_is_shown(echo_service):
    first, second = await make_user("first"), await make_user("second")
    staff = await logged_in(await make_user("ops", staff=True, perms=ALL_CONSOLE_PERMS))
    live = await api.open_session(SessionRequest(user_key=str(first.pk)))
    await next_event(live, Ready)

    reply = await staff.post("/ops/console/admission/", {"confirm": "admission", "open": "0"})
    assert reply.json()["outcome"] == "new calls refused"
    with pytest.raises(api.ParleyError) as refused:
        await api.open_session(SessionRequest(user_key=str(second.pk)))
    assert refused.value.code == "resource_exhausted" and "administrator" in refused.value.message
    again = await api.open_session(SessionRequest(user_key=str(first.pk)))  # the live session's user reattaches
    assert (await next_event(again, Ready)).resumed

    await staff.post("/ops/console/admission/", {"confirm": "admission", "open": "1"})
    reply = await staff.post("/ops/console/services/in-process/drain/", {"confirm": "in-process", "draining": "1"})
    assert reply.json()["outcome"] == "draining"
    (service,) = await api.services()
    assert service.state == "draining"
    (live_row,) = service.sessions
    assert live_row.user_key == str(first.pk) and live_row.record is True  # asked for (the default) and allowed
    with pytest.raises(api.ParleyError, match="draining"):
        await api.open_session(SessionRequest(user_key=str(second.pk)))
    unknown = await staff.post("/ops/console/services/gpu-9/drain/", {"confirm": "gpu-9"})
    assert unknown.status_code == 409 and unknown.json()["outcome"] == "no such service"
    actions = [a async for a in AuditEntry.objects.order_by("at").values_list("action", flat=True)]
    assert actions == ["stop_admission", "resume_admission", "drain_service", "drain_service"]


async def test_metrics_scrape_matches_the_console(echo_service):
    users = [await make_user(f"user{i}") for i in range(3)]
    client = await logged_in(await make_user("watcher", staff=True, perms=("view_console",)))
    handles = [await api.open_session(SessionRequest(user_key=str(u.pk))) for u in users]  # 2 slots: one queues
    await next_event(handles[0], Ready)
    await next_event(handles[1], Ready)
    for _ in range(6):  # the worker ticks while a slot is open: give the histogram some ticks
        await handles[1].append_audio(FRAME, encoding="pcm16", rate=24000)
        await asyncio.sleep(0.08)
    await handles[0].pause()
    with pytest.raises(api.ParleyError):  # queue_max=2 holds one; stop admitting to count a refusal
        await api.set_admission(False)
        await api.open_session(SessionRequest(user_key="999"))
    await api.set_admission(True)

    socket = await console_socket(client)
    assert (await socket.connect())[0]
    console = json.loads(await socket.receive_from(timeout=5))
    text = (await client.get("/ops/metrics")).content.decode()

    def sample(name: str, **labels) -> float:
        label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        pattern = rf"^{name}\{{{re.escape(label_text)}\}} (\S+)$" if labels else rf"^{name} (\S+)$"
        match = re.search(pattern, text, re.MULTILINE)
        assert match, f"{name} {labels} not in the scrape"
        return float(match.group(1))

    sid = "in-process"
    for state in ("active", "paused", "detached", "queued"):
        assert sample("parley_sessions", service=sid, state=state) == console["totals"]["sessions"][state], state
    assert console["totals"]["sessions"] == {"active": 1, "paused": 1, "detached": 0, "queued": 1}
    assert sample("parley_slots_used", service=sid) == console["totals"]["slots_used"] == 2
    assert sample("parley_slots_total", service=sid) == console["totals"]["slots_total"] == 2
    # what the engine reports it admits (the echo engine: its slots), on the console and in the scrape alike
    assert sample("parley_capacity_sessions", service=sid) == console["totals"]["capacity"] == 2
    assert console["services"][0]["capacity"]["call_mix"] == 2
    assert sample("parley_queue_length", service=sid) == console["totals"]["queue_length"] == 1
    assert sample("parley_queue_wait_estimate_seconds", service=sid) == console["queue"][0]["estimated_wait_s"]
    assert sample("parley_admissions_refused_total", reason="admission_stopped") >= 1
    assert sample("parley_tick_seconds_count", service=sid) > 0
    assert sample("parley_service_state", service=sid, state="serving") == 1
    await socket.disconnect()
    for handle in handles:
        await handle.close()


async def test_revoked_credentials_close_the_live_console_with_4401_and_it_cannot_reopen(echo_service):
    boss = await make_user("boss", staff=True, perms=("view_console",))
    bystander = await make_user("bystander", staff=True, perms=("view_console",))
    staff = await logged_in(boss)
    socket = await console_socket(staff)
    assert (await socket.connect())[0]
    json.loads(await socket.receive_from(timeout=5))  # the first snapshot: the console is live

    bystander.is_active = False  # someone else's revocation leaves this console alone
    await sync_to_async(bystander.save)()
    await snapshot_where(socket, lambda snapshot: True)
    boss.is_active = False
    await sync_to_async(boss.save)()
    assert await close_code(socket) == 4401  # at once (3 s), not at the next page load
    assert not (await (await console_socket(staff)).connect())[0]  # the cookie no longer opens it


async def test_revoking_the_api_key_closes_the_console_it_opened(echo_service):
    boss = await make_user("keyholder", staff=True, perms=("view_console",))
    api_key, raw_key = await sync_to_async(apikey_create)(user=boss, name="ops")
    spare, _ = await sync_to_async(apikey_create)(user=boss, name="spare")
    socket = await key_console_socket(raw_key)
    assert (await socket.connect())[0]
    json.loads(await socket.receive_from(timeout=5))

    await sync_to_async(apikey_revoke)(api_key=spare)  # another key of the same user: no effect
    await snapshot_where(socket, lambda snapshot: True)
    await sync_to_async(apikey_revoke)(api_key=api_key)
    assert await close_code(socket) == 4401
    assert not (await (await key_console_socket(raw_key)).connect())[0]


async def test_a_hub_download_in_this_process_is_on_the_console(echo_service, tmp_path):
    from inference.checkpoints.hub import resolve_checkpoint
    from inference.config import HubAccess
    from tests.inference.checkpoints.local_hub import LocalHub

    client = await logged_in(await make_user("watcher", staff=True, perms=("view_console",)))
    with LocalHub({"nvidia/personaplex-7b-v1": TINY_PERSONAPLEX}) as hub:
        access = HubAccess(cache_dir=tmp_path / "hub", endpoint=hub.url)
        await asyncio.to_thread(resolve_checkpoint, "nvidia/personaplex-7b-v1", access)
    socket = await console_socket(client)
    assert (await socket.connect())[0]
    console = json.loads(await socket.receive_from(timeout=5))
    (download,) = [d for d in console["downloads"] if d["repo"] == "nvidia/personaplex-7b-v1"]
    assert download["state"] == "done" and download["bytes_done"] == download["bytes_total"] > 0
    assert download["files_done"] == download["files_total"] == 5
    await socket.disconnect()
