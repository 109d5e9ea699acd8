"""A web process's link: its sessions share one connection to the service, each on a channel of its own.

The service and its socket server run in this process (``served``), so the service's side of the link can be
watched.
"""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from inference.contracts import AudioOut, Closed, ErrorEvent, Ready, SessionRequest
from inference.transport import frame_batch, server, wire
from inference.transport.client import RemoteSessionHandle
from inference.transport.link import close_links
from inference.transport.service_link import ServiceLink
from tests.inference.event_helpers import EventReader, pcm16_frame

FRAME_16K = 1280  # 80 ms at the served echo engine's 16 kHz


@pytest.fixture
def service_links(monkeypatch) -> list[ServiceLink]:
    """Every link the service accepts in this test."""
    made: list[ServiceLink] = []

    class Counted(ServiceLink):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(server, "ServiceLink", Counted)
    return made


async def talk(handle, markers, period_s: float = 0.08) -> None:
    for marker in markers:
        await handle.append_audio(pcm16_frame(marker, FRAME_16K), encoding="pcm16", rate=16_000, answered=False)
        await asyncio.sleep(period_s)


def heard(reader: EventReader) -> set[int]:
    """The sample values this handle got back (the echo engine returns its input as it came)."""
    values: set[int] = set()
    for event in reader.seen:
        if isinstance(event, AudioOut):
            values.update(np.unique(np.frombuffer(event.pcm16, "<i2")).tolist())
    return values - {0}


async def test_a_processs_calls_share_one_link_and_each_hears_only_its_own_audio(served, service_links):
    service, address = served
    handles = [await RemoteSessionHandle.open(address, SessionRequest(user_key=f"u{i}")) for i in range(4)]
    readers = [EventReader(h) for h in handles]
    for reader in readers:
        assert isinstance(await reader.next(), Ready)
    assert len(service_links) == 1 and len({id(h._link) for h in handles}) == 1
    assert len({h.channel for h in handles}) == 4
    markers = [range(1000 * (i + 1), 1000 * (i + 1) + 12) for i in range(4)]
    await asyncio.gather(*(talk(h, m) for h, m in zip(handles, markers, strict=True)))
    await asyncio.sleep(0.5)  # the echo's delay: the last frames come back a little after they went
    for i, (handle, reader) in enumerate(zip(handles, readers, strict=True)):
        await handle.close()
        assert await reader.until(Closed) == Closed("client_close")  # every event before it is in reader.seen
        got = heard(reader)
        assert got and got <= set(markers[i]), (i, sorted(got)[:5])
    assert not service_links[0].handles and not handles[0]._link.channels  # nothing stays once the calls end


async def test_a_frame_the_service_cannot_read_is_refused_on_its_channel_alone(served, service_links):
    service, address = served
    bad, good = [await RemoteSessionHandle.open(address, SessionRequest(user_key=u)) for u in ("bad", "good")]
    bad_reader, good_reader = EventReader(bad), EventReader(good)
    await bad_reader.until(Ready)
    await good_reader.until(Ready)
    bad._link.send(bad.channel, wire.frame(wire.JSON, b"not json"))
    error = await bad_reader.until(ErrorEvent)
    assert error.code == "internal_error" and "could not read a frame" in error.message
    bad._link.send(bad.channel, wire.json_frame({"id": 99, "op": "set_mode", "args": {"turn_detection": 5}}))
    # Both sessions go on, on the same link: an answered call on each still works.
    await bad.pause()
    await good.append_audio(pcm16_frame(7, FRAME_16K), encoding="pcm16", rate=16_000)
    assert len(service_links) == 1 and set(service_links[0].handles) == {bad.channel, good.channel}
    await bad.close()
    await good.close()


async def test_closing_the_link_detaches_its_sessions_for_their_grace(served):
    service, address = served
    handle = await RemoteSessionHandle.open(address, SessionRequest(user_key="gina"))
    reader = EventReader(handle)
    ready = await reader.next()
    await close_links()  # as the web process going away
    assert await reader.ended()
    for _ in range(100):
        states = {s.session_id: s.state for s in service.occupancy()[0].slots if s.session_id}
        if states.get(ready.session_id) == "detached":
            break
        await asyncio.sleep(0.02)
    assert states[ready.session_id] == "detached"
    back = await RemoteSessionHandle.open(address, SessionRequest(user_key="gina"))  # a new link, the same session
    again = await EventReader(back).next()
    assert isinstance(again, Ready) and again.session_id == ready.session_id and again.resumed
    await back.close()


async def test_a_web_process_that_stops_reading_loses_audio_counted_and_then_catches_up(
    served, service_links, monkeypatch
):
    """The service keeps no more than its bound for a link whose peer is behind: the outboxes keep the newest
    audio and count what they dropped; once the web process reads again, events flow on the same link."""
    monkeypatch.setattr(frame_batch, "HIGH_WATER_BYTES", 16 * 1024)
    service, address = served
    handle = await RemoteSessionHandle.open(address, SessionRequest(user_key="slow"))
    reader = EventReader(handle)
    await reader.until(Ready)
    session = service.sessions["slow"]
    link = service_links[0]
    # The kernel's socket buffer would hold seconds of audio first: keep it small, so the link's own bound shows.
    link.out._writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    await talk(handle, range(1, 6))  # live: from now on the echo engine answers every tick
    handle._link._writer.transport.pause_reading()  # the web process's loop stops taking the link's frames
    try:
        for _ in range(200):
            if session.attachment.outbox.dropped_audio:
                break
            await asyncio.sleep(0.05)
        assert session.attachment.outbox.dropped_audio > 0  # counted, and reported as the session's dropped_out
        assert link._resume is not None  # waiting for the peer, not writing past the bound
        assert link.out._writer.transport.get_write_buffer_size() < 2 * frame_batch.HIGH_WATER_BYTES
    finally:
        handle._link._writer.transport.resume_reading()
    seen = len(reader.seen)
    await talk(handle, [5] * 5)
    await reader.until(AudioOut)
    assert len(reader.seen) > seen and link._resume is None
    await handle.close()
    assert await reader.until(Closed, within_s=10) == Closed("client_close")
