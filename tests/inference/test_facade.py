"""The facade, in-process, with the echo engine: sessions, takeover, grace, pause, queue, errors."""

from __future__ import annotations

import asyncio
import threading

import pytest

from inference import api
from inference.contracts import (
    AudioOut,
    Closed,
    ErrorEvent,
    Metrics,
    ParleyError,
    Paused,
    Prefill,
    Queued,
    Ready,
    Replaced,
    Resumed,
    SessionRequest,
    TextOut,
    VoiceRef,
)
from inference.engines.echo import EchoEngine
from tests.inference.event_helpers import EventReader, pcm16_frame, send_frames


async def open_ready(user: str, **kwargs) -> tuple[object, EventReader, Ready]:
    handle = await api.open_session(SessionRequest(user_key=user, **kwargs))
    reader = EventReader(handle)
    ready = await reader.next()
    assert isinstance(ready, Ready), ready
    return handle, reader, ready


async def slot_states() -> list[str]:
    (snapshot,) = await api.occupancy()
    return [s.state for s in snapshot.slots]


async def test_audio_echoes_back_with_text_naming_the_frame(facade):
    await facade(slots=1, echo_delay_frames=2)
    handle, reader, ready = await open_ready("alice", persona="calm", voice=VoiceRef("v1"))
    assert ready.resumed is False and ready.persona == "calm" and ready.voice == "v1"
    assert ready.capabilities.engine == "echo" and "no model" in ready.capabilities.extra["label"]
    assert handle.session_id == ready.session_id
    await send_frames(handle, range(100, 112))
    assert await reader.until(Prefill) == Prefill(progress=1.0, done=True)
    await reader.until(Metrics, within_s=3)
    audio = [e.pcm16 for e in reader.seen if isinstance(e, AudioOut)]
    markers = {pcm16_frame(m): m for m in range(100, 112)}
    echoed = [markers[a] for a in audio if a in markers]
    assert len(echoed) >= 8 and echoed == sorted(echoed)  # in order, none invented
    texts = [e.text for e in reader.seen if isinstance(e, TextOut)]
    assert texts[:2] == ["[frame 0] ", "[frame 1] "]
    metrics = next(e for e in reader.seen if isinstance(e, Metrics)).values
    assert metrics["frames_in"] >= 8 and metrics["tick_ms_p99"] > 0
    await handle.close()
    assert await reader.until(Closed) == Closed("client_close")
    assert await reader.ended()


async def test_second_connection_takes_over_the_same_session(facade):
    await facade(slots=1)
    first, first_reader, ready = await open_ready("bob")
    await send_frames(first, [1, 2])
    second, second_reader, again = await open_ready("bob")
    assert again.session_id == ready.session_id and again.resumed is True
    assert await first_reader.until(Replaced) == Replaced()
    assert await first_reader.ended()
    with pytest.raises(ParleyError) as info:
        await first.append_audio(pcm16_frame(1), encoding="pcm16", rate=24000)
    assert info.value.code == "session_not_ready"
    await first.close()  # the replaced connection's disconnect must not end the session
    await first.detach()
    await send_frames(second, [7, 7, 7, 7, 7, 7])
    await second_reader.until(AudioOut)
    assert await slot_states() == ["live"]


async def test_reconnect_within_grace_resumes_the_same_session(facade):
    await facade(slots=1, disconnect_grace_s=2.0)
    handle, reader, ready = await open_ready("carol")
    await send_frames(handle, [3, 3, 3])
    await handle.detach()
    assert await reader.ended()
    assert await slot_states() == ["detached"]
    back, back_reader, again = await open_ready("carol")
    assert again.session_id == ready.session_id and again.resumed is True
    await send_frames(back, [9] * 6)
    echoed = await back_reader.until(AudioOut)
    assert echoed.pcm16 in (pcm16_frame(3), pcm16_frame(9), pcm16_frame(0))
    assert await slot_states() == ["live"]


class BlockingCloseEcho(EchoEngine):
    """close_slot waits for the test's signal, so 'freed only after confirmed cleanup' is observable."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.release = threading.Event()

    def close_slot(self, slot: int) -> None:
        self.release.wait(5)
        super().close_slot(slot)


async def test_grace_expiry_closes_and_frees_the_slot_only_after_cleanup(facade):
    engine = BlockingCloseEcho(1)
    await facade(engine_instance=engine, slots=1, disconnect_grace_s=0.3)
    handle, reader, ready = await open_ready("dave")
    await send_frames(handle, [5, 5])
    await handle.detach()
    # A second user waits in the queue for the only slot.
    waiting = await api.open_session(SessionRequest(user_key="erin"))
    waiting_reader = EventReader(waiting)
    assert isinstance(await waiting_reader.next(), Queued)
    await asyncio.sleep(0.6)  # grace expired; the engine is still cleaning up
    assert await slot_states() == ["closing"]
    assert waiting.session_id is None
    engine.release.set()
    admitted = await waiting_reader.until(Ready)
    assert admitted.session_id != ready.session_id and admitted.resumed is False
    assert await slot_states() in (["prefilling"], ["live"])
    # The expired session is gone: dave starts a new one.
    await waiting.close()
    fresh = await EventReader(await api.open_session(SessionRequest(user_key="dave"))).until(Ready)
    assert fresh.session_id != ready.session_id and fresh.resumed is False


async def test_pause_watchdog_closes_with_pause_timeout(facade):
    await facade(slots=1, pause_timeout_s=0.4)
    handle, reader, _ = await open_ready("frank")
    await send_frames(handle, [1, 1])
    await handle.pause()
    assert await reader.until(Paused) == Paused()
    assert await slot_states() == ["paused"]
    await handle.resume()
    assert await reader.until(Resumed) == Resumed()
    await asyncio.sleep(0.5)  # resumed: the watchdog was cancelled
    assert await slot_states() == ["live"]
    await handle.pause()
    assert await reader.until(Closed, within_s=2) == Closed("pause_timeout")
    assert await reader.ended()
    await asyncio.sleep(0.2)
    assert await slot_states() == ["free"]


async def test_one_slot_two_users_queue_then_admission(facade):
    await facade(slots=1, queue_max=2)
    first, first_reader, _ = await open_ready("gina")
    second = await api.open_session(SessionRequest(user_key="hank"))
    third = await api.open_session(SessionRequest(user_key="ivy"))
    second_reader, third_reader = EventReader(second), EventReader(third)
    assert await second_reader.next() == Queued(1, 1, pytest.approx(120.0))
    third_queued = await third_reader.next()
    assert (third_queued.position, third_queued.queue_length) == (2, 2)
    assert second.session_id is None
    with pytest.raises(ParleyError) as info:
        await second.append_audio(pcm16_frame(1), encoding="pcm16", rate=24000)
    assert info.value.code == "session_not_ready"
    await first.close()
    ready = await second_reader.next()
    assert isinstance(ready, Ready) and second.session_id == ready.session_id
    moved = await third_reader.next()
    assert isinstance(moved, Queued) and moved.position == 1


async def test_queued_users_hear_their_position_at_least_every_3_s(facade):
    await facade(slots=1, queue_max=1)
    await open_ready("jack")
    waiting = await api.open_session(SessionRequest(user_key="kate"))
    reader = EventReader(waiting)
    assert isinstance(await reader.next(), Queued)
    assert isinstance(await reader.next(within_s=3.5), Queued)


async def test_full_queue_is_resource_exhausted(facade):
    await facade(slots=1, queue_max=1)
    await open_ready("leo")
    await api.open_session(SessionRequest(user_key="mia"))
    with pytest.raises(ParleyError) as info:
        await api.open_session(SessionRequest(user_key="ned"))
    assert (info.value.code, info.value.error_type) == ("resource_exhausted", "rate_limit_error")
    await facade(slots=1, queue_max=0)  # queueing disabled
    await open_ready("leo")
    with pytest.raises(ParleyError) as info:
        await api.open_session(SessionRequest(user_key="mia"))
    assert info.value.code == "resource_exhausted"


async def test_queued_user_reopening_keeps_their_place(facade):
    await facade(slots=1, queue_max=2)
    await open_ready("olga")
    old = await api.open_session(SessionRequest(user_key="paul"))
    old_reader = EventReader(old)
    await old_reader.next()
    new = await api.open_session(SessionRequest(user_key="paul"))
    new_reader = EventReader(new)
    assert await old_reader.next() == Replaced()
    assert (await new_reader.next()).position == 1
    (snapshot,) = await api.occupancy()
    assert snapshot.queue_length == 1


async def test_input_faster_than_real_time_gets_backpressure(facade):
    await facade(slots=1, input_queue_frames=4)
    handle, reader, _ = await open_ready("quinn")
    await handle.append_audio(pcm16_frame(1), encoding="pcm16", rate=24000)
    await reader.until(Prefill)
    refused = []
    for _ in range(30):  # 2.4 s of audio at once
        try:
            await handle.append_audio(pcm16_frame(2), encoding="pcm16", rate=24000)
        except ParleyError as exc:  # the append that overflowed hears it (at most once a second)
            refused.append(exc.code)
    assert refused == ["input_backpressure"]
    metrics = await reader.until(Metrics)
    assert metrics.values["dropped_frames"] >= 20


class FaultyEcho(EchoEngine):
    def step(self, inputs):
        if any(float(i.audio[0]) == 0.5 for i in inputs.values()):
            raise RuntimeError("simulated device fault")
        return super().step(inputs)


async def test_engine_exception_ends_the_session_and_the_worker_lives_on(facade):
    await facade(engine_instance=FaultyEcho(1), slots=1)
    handle, reader, _ = await open_ready("rita")
    await handle.append_audio(pcm16_frame(16384), encoding="pcm16", rate=24000)  # 16384 / 32768 = 0.5
    error = await reader.until(ErrorEvent)
    assert (error.code, error.error_type) == ("engine_failed", "server_error")
    assert await reader.until(Closed) == Closed("engine_failed")
    # Closed goes out at once; the slot frees only when the worker thread confirms the cleanup a moment later
    # (reopening before that is queued, which is right, but not what this test is about).
    for _ in range(150):
        if await slot_states() == ["free"]:
            break
        await asyncio.sleep(0.02)
    again, again_reader, _ = await open_ready("rita")
    await send_frames(again, [100] * 5)
    assert isinstance(await again_reader.until(AudioOut), AudioOut)


async def test_persona_and_voice_are_fixed_once_audio_started(facade):
    await facade(slots=1)
    handle, _, _ = await open_ready("sam")
    await handle.update(persona="a pirate", voice=VoiceRef("v2"))
    await handle.append_audio(pcm16_frame(1), encoding="pcm16", rate=24000)
    await handle.update(persona="a pirate")  # unchanged is fine
    with pytest.raises(ParleyError) as info:
        await handle.update(persona="a poet")
    assert info.value.code == "persona_update_unsupported"
    with pytest.raises(ParleyError) as info:
        await handle.update(voice=VoiceRef("v3"))
    assert info.value.code == "voice_update_unsupported"


async def test_bad_input_gets_typed_errors_and_the_session_goes_on(facade):
    await facade(slots=1)
    handle, reader, _ = await open_ready("tess")
    cases = [
        (handle.append_audio(b"\x01\x02\x03", encoding="pcm16", rate=24000), "invalid_audio"),
        (handle.append_audio(b"\x00" * 8, encoding="mp3", rate=24000), "unsupported_audio_format"),
        (handle.append_image(b"\xff\xd8\xff\xe0"), "unsupported_input"),
        (handle.force_listen(), "unsupported_input"),
        (handle.playback_ack(float("nan")), "invalid_value"),
    ]
    for call, code in cases:
        with pytest.raises(ParleyError) as info:
            await call
        assert info.value.code == code
    with pytest.raises(ParleyError) as info:
        await api.open_session(SessionRequest(user_key="tess", model="no-such-model"))
    assert info.value.code == "model_not_found"
    await send_frames(handle, [3] * 4)
    assert isinstance(await reader.until(AudioOut), AudioOut)


async def test_other_rates_are_resampled_to_the_engine_rate(facade):
    await facade(slots=1, echo_delay_frames=0)
    handle, reader, _ = await open_ready("uma")
    for _ in range(6):  # 80 ms at 48 kHz in f32
        await handle.append_audio(b"\x00\x00\x00\x3f" * 3840, encoding="f32", rate=48000)
        await asyncio.sleep(0.08)
    await reader.until(Prefill)
    audio = await reader.until(AudioOut)
    assert len(audio.pcm16) == 2 * 1920


async def test_cancel_advances_the_epoch(facade):
    await facade(slots=1)
    handle, reader, _ = await open_ready("vic")
    await send_frames(handle, [1] * 3)
    before = await reader.until(AudioOut)
    await handle.cancel()
    await send_frames(handle, [2] * 3)
    after = await reader.until(AudioOut)
    while after.epoch == before.epoch:
        after = await reader.until(AudioOut)
    assert after.epoch == before.epoch + 1


async def test_admin_end_session_and_occupancy(facade):
    await facade(slots=2)
    handle, reader, ready = await open_ready("walt")
    (snapshot,) = await api.occupancy()
    assert snapshot.engine == "echo" and snapshot.num_slots == 2
    assert [s.user_key for s in snapshot.slots] == ["walt", None]
    assert await api.end_session(ready.session_id) is True
    assert await reader.until(Closed) == Closed("admin_ended")
    assert await api.end_session("sess_nope") is False
    preview = api.capabilities_preview()
    assert preview["engine"] == "echo" and preview["chunk_period_ms"] == 80


async def test_max_duration_and_idle_timeout_close_the_session(facade):
    await facade(slots=1, max_session_s=0.4)
    handle, reader, _ = await open_ready("xena")
    assert await reader.until(Closed, within_s=2) == Closed("max_duration")
    await facade(slots=1, idle_timeout_s=0.5)
    handle, reader, _ = await open_ready("yuri")
    await handle.append_audio(pcm16_frame(1), encoding="pcm16", rate=24000)
    assert await reader.until(Closed, within_s=3) == Closed("idle_timeout")


async def test_a_queued_user_who_drops_leaves_the_queue(facade):
    await facade(slots=1, queue_max=2)
    await open_ready("zoe")
    first = await api.open_session(SessionRequest(user_key="abe"))
    second = await api.open_session(SessionRequest(user_key="bea"))
    second_reader = EventReader(second)
    assert (await second_reader.next()).position == 2
    await first.detach()
    moved = await second_reader.next()
    assert isinstance(moved, Queued) and moved.position == 1 and moved.queue_length == 1


async def test_outbox_drops_the_oldest_audio_but_never_control_events():
    from inference.session.outbox import Outbox

    outbox = Outbox(max_audio=3)
    outbox.put(Prefill(1.0, True))
    for k in range(6):
        outbox.put(AudioOut(bytes([k, 0]), epoch=0))
        outbox.put(TextOut(f"[frame {k}] ", epoch=0))
    outbox.put(Closed("client_close"))
    outbox.finish()
    events = [e async for e in outbox.stream()]
    assert outbox.dropped_audio == 3
    assert [e.pcm16[0] for e in events if isinstance(e, AudioOut)] == [3, 4, 5]
    assert len([e for e in events if isinstance(e, TextOut)]) == 6
    assert events[0] == Prefill(1.0, True) and events[-1] == Closed("client_close")


async def test_a_slow_reader_sees_bounded_audio_and_a_dropped_count(facade):
    await facade(slots=1, output_queue_frames=4, echo_delay_frames=0)
    handle, reader, _ = await open_ready("zed")
    await send_frames(handle, range(1, 20))  # 1.5 s in which nobody reads the events
    audio = []
    while True:
        try:
            event = await reader.next(within_s=0.05, skip_media=False)
        except TimeoutError:
            break
        if isinstance(event, AudioOut):
            audio.append(event)
    assert 1 <= len(audio) <= 5  # what was buffered: the newest 4 (plus one produced meanwhile)
    metrics = await reader.until(Metrics)
    assert metrics.values["dropped_frames"] >= 10


async def test_a_timed_out_read_does_not_end_the_event_stream():
    from inference.session.outbox import Outbox

    outbox = Outbox(max_audio=2)
    events = outbox.stream()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(events), 0.05)
    outbox.put(Paused())
    assert await asyncio.wait_for(anext(events), 1) == Paused()
