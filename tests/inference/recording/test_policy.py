"""Recording policy through the real in-process service: on by default, off per session, forced by
the deployment, fixed once audio starts; the session's events land in the raw recording."""

from __future__ import annotations

import asyncio
import json

import pytest

from inference import api
from inference.contracts import ParleyError, Ready, Resumed, SessionRequest
from inference.recording.chunks import END_FILE
from inference.recording.reader import read_recording
from tests.inference.event_helpers import EventReader, send_frames


@pytest.fixture
async def service(tmp_path):
    async def start(**overrides):
        await api.start(engine="echo", slots=2, recordings_dir=tmp_path, **overrides)

    yield start
    await api.shutdown()


async def call(user: str, *, record: bool = True, frames: int = 15, update_record: bool | None = None):
    handle = await api.open_session(SessionRequest(user_key=user, record=record))
    reader = EventReader(handle)
    ready = await reader.until(Ready, within_s=10)
    if update_record is not None:
        await handle.update(record=update_record)
    await send_frames(handle, range(100, 100 + frames))
    return handle, reader, ready


async def wait_for_end(folder, timeout_s: float = 5.0) -> dict:
    for _ in range(int(timeout_s / 0.05)):
        if (folder / END_FILE).exists():
            return json.loads((folder / END_FILE).read_text())
        await asyncio.sleep(0.05)
    raise AssertionError(f"{folder.name}: no end.json")


async def test_sessions_are_recorded_by_default_with_their_events(service, tmp_path):
    await service()
    handle, reader, ready = await call("ann", frames=20)
    assert ready.recorded and ready.capabilities.extra["record_policy"] == "auto"
    await handle.playback_ack(640.0)
    await handle.pause()
    await asyncio.sleep(0.3)
    await handle.resume()
    await reader.until(Resumed)
    await handle.cancel()
    await send_frames(handle, range(200, 205))
    await handle.close()
    end = await wait_for_end(tmp_path / ready.session_id)
    assert end["reason"] == "client_close" and end["problem"] is None
    raw = read_recording(tmp_path / ready.session_id)
    kinds = [e["k"] for e in raw.events]
    for kind in ("ack", "pause", "resume", "epoch", "text"):
        assert kind in kinds, kind
    ack = next(e for e in raw.events if e["k"] == "ack")
    assert ack["played_ms"] == 640.0 and ack["sent_ms"] > 0
    # The pause froze the engine for 0.3 s: on the call's wall clock that is marked silence, not a cut.
    pause = next(g for g in raw.gaps if g["cause"] == "pause")
    assert pause["end"] - pause["t"] == pytest.approx(0.3, abs=0.15)
    added = sum(g["end"] - g["t"] for g in raw.gaps if g["cause"] != "no_caller_audio")
    # ... plus under a period of lead-in (the wait for the first tick) and of tail (the close after the last).
    assert raw.steps >= 20 and 0 <= raw.duration_s - (raw.steps * 0.08 + added) < 2 * 0.08 + 0.01


async def test_a_session_can_ask_not_to_be_recorded(service, tmp_path):
    await service()
    handle, _, ready = await call("bob", record=False)
    assert not ready.recorded
    await handle.close()
    other, _, ready2 = await call("cid", update_record=False)  # session.duplex.record: false, before audio
    await other.close()
    await asyncio.sleep(0.3)
    assert not (tmp_path / ready.session_id).exists() and not (tmp_path / ready2.session_id).exists()


async def test_the_deployment_forces_recording_on_or_off(service, tmp_path):
    await service(record="on")
    handle, _, ready = await call("dee", record=False)
    assert ready.recorded and ready.capabilities.extra["record_policy"] == "on"
    await handle.close()
    await wait_for_end(tmp_path / ready.session_id)
    await service(record="off")
    handle, _, ready = await call("eve", record=True)
    assert not ready.recorded
    await handle.close()
    await asyncio.sleep(0.3)
    assert not (tmp_path / ready.session_id).exists()


async def test_recording_is_fixed_once_audio_has_started(service, tmp_path):
    await service()
    handle, _, ready = await call("fay")
    with pytest.raises(ParleyError) as err:
        await handle.update(record=False)
    assert err.value.code == "record_update_unsupported"
    await handle.update(record=True)  # the same value again is fine (stock clients resend fields)
    await handle.close()
    assert (await wait_for_end(tmp_path / ready.session_id))["reason"] == "client_close"
