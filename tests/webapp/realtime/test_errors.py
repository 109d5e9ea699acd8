"""Every error code that applies today: the bad input, the error event, then proof the session goes on."""

import base64
import dataclasses

import numpy as np
import pytest
from channels.db import database_sync_to_async

from inference.engines.base import EngineError
from inference.engines.echo import EchoEngine
from tests.webapp.realtime.realtime_helpers import FRAME, b64, make_account, open_peer, ready_peer, to_pcm16, tone
from webapp.personas.models import Persona, Voice

pytestmark = pytest.mark.django_db(transaction=True)


async def rejected(peer, event=None, *, text=None, data=None) -> dict:
    """Send a bad input; return the error body."""
    if event is not None:
        await peer.send(event)
    else:
        await peer.send_raw(text=text, data=data)
    return await peer.error()


async def test_invalid_json(alice):
    peer, _ = await ready_peer(alice)
    error = await rejected(peer, text="{not json")
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_json")
    assert (await rejected(peer, text="[1, 2]"))["code"] == "invalid_json"
    await peer.proves_alive()
    await peer.close()


async def test_unknown_event_echoes_the_client_event_id(alice):
    peer, _ = await ready_peer(alice)
    error = await rejected(peer, {"type": "conversation.item.teleport", "event_id": "client-7"})
    assert error["code"] == "unknown_event" and error["event_id"] == "client-7" and error["param"] == "type"
    assert (await rejected(peer, {"no_type": True}))["code"] == "unknown_event"
    assert (await rejected(peer, data=b"\x07abc"))["code"] == "unknown_event"  # unknown binary frame kind
    await peer.proves_alive()
    await peer.close()


async def test_invalid_value_for_a_known_event(alice):
    peer, _ = await ready_peer(alice)
    error = await rejected(peer, {"type": "playback.ack", "played_ms": "soon", "event_id": "ack-1"})
    assert error["code"] == "invalid_value" and error["param"] == "played_ms" and error["event_id"] == "ack-1"
    assert (await rejected(peer, {"type": "input_audio_buffer.append"}))["param"] == "audio"
    await peer.proves_alive()
    await peer.close()


async def test_event_too_large(alice):
    peer, _ = await ready_peer(alice)
    big = b64(bytes(800 * 1024))  # 1.07 MB of base64: over the 1 MiB limit
    error = await rejected(peer, {"type": "input_audio_buffer.append", "audio": big})
    assert error["code"] == "event_too_large"
    assert (await rejected(peer, data=b"\x01" + bytes(1024 * 1024 + 2)))["code"] == "event_too_large"
    await peer.proves_alive()
    await peer.close()


async def test_invalid_audio(alice):
    peer, _ = await ready_peer(alice)
    await peer.prime()
    bad_base64 = await rejected(peer, {"type": "input_audio_buffer.append", "audio": "***not base64***"})
    assert bad_base64["code"] == "invalid_audio" and bad_base64["param"] == "audio"
    odd = await rejected(peer, {"type": "input_audio_buffer.append", "audio": b64(b"\x01\x02\x03")})
    assert odd["code"] == "invalid_audio"
    await peer.send({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm-f32"}}}}})
    await peer.until("session.updated")
    samples = np.zeros(FRAME, "<f4")
    samples[10] = np.nan
    assert (await rejected(peer, {"type": "input_audio_buffer.append", "audio": b64(samples.tobytes())}))[
        "code"
    ] == "invalid_audio"
    samples[10] = np.inf
    assert (await rejected(peer, data=b"\x01" + samples.tobytes()))["code"] == "invalid_audio"
    await peer.send({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm"}}}}})
    await peer.until("session.updated")
    await peer.proves_alive()
    await peer.close()


async def test_unsupported_audio_format_changes_nothing(alice):
    peer, _ = await ready_peer(alice)
    error = await rejected(
        peer, {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}}
    )
    assert error["code"] == "unsupported_audio_format" and error["param"] == "session.audio.input.format.type"
    error = await rejected(
        peer,
        {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 12345}}}}},
    )
    assert error["code"] == "unsupported_audio_format" and error["param"] == "session.audio.input.format.rate"
    error = await rejected(
        peer,
        {"type": "session.update", "session": {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}}},
    )
    assert error["code"] == "unsupported_audio_format"
    await peer.proves_alive()  # still pcm16 at 24 kHz: the rejected updates changed nothing
    await peer.close()


async def test_unsupported_input_image_on_an_audio_engine(alice):
    png = b"\x89PNG\r\n\x1a\n" + bytes(32)
    peer, _ = await ready_peer(alice)
    error = await rejected(peer, {"type": "input_image.append", "image": base64.b64encode(png).decode()})
    assert error["code"] == "unsupported_input"
    assert (await rejected(peer, {"type": "response.force_listen"}))["code"] == "unsupported_input"
    await peer.proves_alive()
    await peer.close()


async def test_persona_and_voice_not_found(alice):
    bob = await make_account("bob")
    bobs = await database_sync_to_async(Persona.objects.create)(owner=bob.user, name="bob's", instructions="x")
    await database_sync_to_async(Voice.objects.create)(owner=bob.user, name="bobvoice", status=Voice.Status.READY)
    peer, _ = await ready_peer(alice)
    for persona_id in (999_999, bobs.pk, "abc"):  # missing, another user's, malformed
        error = await rejected(peer, {"type": "session.update", "session": {"duplex": {"persona_id": persona_id}}})
        assert error["code"] == "persona_not_found" and error["param"] == "session.duplex.persona_id"
    for voice in ("alloy", "bobvoice", 999_999):
        error = await rejected(peer, {"type": "session.update", "session": {"audio": {"output": {"voice": voice}}}})
        assert error["code"] == "voice_not_found" and error["param"] == "session.audio.output.voice"
    await peer.proves_alive()
    await peer.close()


async def test_updates_that_once_reached_internal_error_are_invalid_values(alice):
    """A 5000-digit input rate (Python's int-string limit) and a lone-surrogate voice (the lookup failed)."""
    peer, _ = await ready_peer(alice)
    huge_rate = '{"type":"session.update","event_id":"u-1","session":{"audio":{"input":{"format":{"type":"audio/pcm","rate":%s}}}}}'
    error = await rejected(peer, text=huge_rate % ("9" * 5000))
    assert (error["type"], error["code"], error["param"], error["event_id"]) == (
        "invalid_request_error",
        "invalid_value",
        "session.audio.input.format.rate",
        "u-1",
    )
    surrogate_voice = '{"type":"session.update","event_id":"u-2","session":{"audio":{"output":{"voice":"\\ud800"}}}}'
    error = await rejected(peer, text=surrogate_voice)
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", "session.audio.output.voice", "u-2")
    error = await rejected(peer, {"type": "session.update", "session": {"duplex": {"persona_id": "\u00b2"}}})
    assert (error["code"], error["param"]) == ("invalid_value", "session.duplex.persona_id")
    await peer.proves_alive()
    await peer.close()


async def test_persona_and_voice_are_fixed_once_audio_started(alice):
    await database_sync_to_async(Voice.objects.create)(owner=None, name="calm", status=Voice.Status.READY)
    await database_sync_to_async(Voice.objects.create)(owner=None, name="bright", status=Voice.Status.READY)
    peer, _ = await ready_peer(alice)
    update = {"instructions": "You are a pirate.", "audio": {"output": {"voice": "calm"}}}
    await peer.send({"type": "session.update", "session": update})
    await peer.until("session.updated")
    await peer.prime()
    # Resending the same values is fine (stock clients resend the whole session) ...
    await peer.send({"type": "session.update", "session": update})
    assert (await peer.until("session.updated"))["session"]["instructions"] == "You are a pirate."
    # ... changing them is not.
    error = await rejected(peer, {"type": "session.update", "session": {"instructions": "You are a poet."}})
    assert error["code"] == "persona_update_unsupported"
    error = await rejected(peer, {"type": "session.update", "session": {"audio": {"output": {"voice": "bright"}}}})
    assert error["code"] == "voice_update_unsupported"
    await peer.send({"type": "session.update", "session": {}})
    session = (await peer.until("session.updated"))["session"]
    assert session["instructions"] == "You are a pirate." and session["audio"]["output"]["voice"] == "calm"
    await peer.proves_alive()
    await peer.close()


async def test_session_not_ready_while_queued_then_resource_exhausted(inference_service):
    await inference_service(slots=1, queue_max=1)
    alice, bob, carol = await make_account("alice"), await make_account("bob"), await make_account("carol")
    first, _ = await ready_peer(alice)
    second, connected, _ = await open_peer(key=bob.key)
    assert connected
    await second.until("session.queued")
    error = await rejected(second, {"type": "input_audio_buffer.append", "audio": b64(bytes(FRAME * 2))})
    assert error["code"] == "session_not_ready"
    assert (await rejected(second, {"type": "session.update", "session": {}}))["code"] == "session_not_ready"

    third, connected, _ = await open_peer(key=carol.key)  # the queue (1) is full
    error = await third.error()
    assert (error["type"], error["code"]) == ("rate_limit_error", "resource_exhausted")
    assert (await third.until("closed"))["code"] == 4013

    await first.proves_alive()
    await second.close()
    await first.close()


async def test_input_backpressure(alice):
    peer, _ = await ready_peer(alice)
    await peer.prime()
    # 40 frames at once: far more than the session's bounded inbox (16 frames) holds.
    await peer.send({"type": "input_audio_buffer.append", "audio": b64(to_pcm16(tone(FRAME * 40))), "event_id": "a-9"})
    error = await peer.error()
    assert error["code"] == "input_backpressure" and error["event_id"] == "a-9"  # the append that overflowed
    await peer.audio_frames(24)  # let the engine work off what the inbox kept
    await peer.proves_alive()
    await peer.close()


class PoisonableEcho(EchoEngine):
    """The echo engine, except that a frame starting with full-scale +1.0 makes step() fail."""

    def step(self, inputs):
        if any(item.audio.size and item.audio[0] >= 0.999 for item in inputs.values()):
            raise EngineError("poisoned frame")
        return super().step(inputs)


async def test_engine_failed_ends_the_session_and_a_new_one_works(alice, inference_service):
    await inference_service(engine_instance=PoisonableEcho(2))
    peer, created = await ready_peer(alice)
    await peer.prime()
    poison = np.zeros(FRAME, np.float32)
    poison[0] = 1.0
    await peer.append(to_pcm16(poison))
    error = await peer.error()
    assert (error["type"], error["code"]) == ("server_error", "engine_failed")
    assert (await peer.until("session.closed"))["reason"] == "engine_failed"
    assert (await peer.until("closed"))["code"] == 4011

    again, created_again = await ready_peer(alice)
    assert created_again["session"]["id"] != created["session"]["id"]
    await again.proves_alive()
    await again.close()


async def test_internal_error_is_reported_and_the_session_goes_on(alice, monkeypatch):
    from webapp.conversations import consumers

    real_open = consumers.api.open_session

    class BuggyPlaybackAck:
        """The real handle, except that playback_ack hits an unexpected bug."""

        def __init__(self, handle):
            self._handle = handle

        def __getattr__(self, name):
            return getattr(self._handle, name)

        async def playback_ack(self, played_ms):
            raise RuntimeError("simulated bug")

    async def open_session(request):
        return BuggyPlaybackAck(await real_open(request))

    monkeypatch.setattr(consumers.api, "open_session", open_session)
    peer, _ = await ready_peer(alice)
    error = await rejected(peer, {"type": "playback.ack", "played_ms": 10, "event_id": "a1"})
    assert (error["type"], error["code"], error["event_id"]) == ("server_error", "internal_error", "a1")
    await peer.proves_alive()
    await peer.close()


async def test_unknown_model_is_refused_with_4008(alice):
    peer, connected, _ = await open_peer(key=alice.key, path="/v1/realtime?model=gpt-no-such-model")
    assert connected
    error = await peer.error()
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert (await peer.until("closed"))["code"] == 4008
    again, created = await ready_peer(alice, path="/v1/realtime?model=echo")
    assert created["session"]["model"] == "echo"
    await again.proves_alive()
    await again.close()


class VideoEcho(EchoEngine):
    """The echo engine declaring video input (it ignores the frames), to reach the image checks."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.capabilities = dataclasses.replace(self.capabilities, video=True)


async def test_invalid_image_on_a_video_engine(alice, inference_service):
    await inference_service(engine_instance=VideoEcho(2))
    peer, created = await ready_peer(alice)
    assert created["session"]["duplex"]["capabilities"]["video"] is True
    await peer.prime()
    error = await rejected(peer, {"type": "input_image.append", "image": "%%%", "event_id": "img-1"})
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_image", "image", "img-1")
    gif = base64.b64encode(b"GIF89a" + bytes(16)).decode()
    assert (await rejected(peer, {"type": "input_image.append", "image": gif}))["code"] == "invalid_image"
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(32)).decode()
    await peer.send({"type": "input_image.append", "image": png, "event_id": "img-ok"})
    await peer.proves_alive()
    assert not any(
        isinstance(e, dict) and e["type"] == "error" and e["error"]["event_id"] == "img-ok" for e in peer.seen
    )
    await peer.close()


async def test_a_database_fault_in_session_update_is_internal_error_and_the_session_goes_on(alice, monkeypatch):
    """The services turn it into a typed error (logged whole there); the consumer only translates it."""
    from django.db import OperationalError

    from webapp.conversations import services

    def locked(**kwargs):
        raise OperationalError("database is locked")

    peer, _ = await ready_peer(alice)
    monkeypatch.setattr(services, "persona_get_for", locked)
    update = {"type": "session.update", "event_id": "u1", "session": {"duplex": {"persona_id": 1}}}
    error = await rejected(peer, update)
    assert (error["type"], error["code"], error["event_id"]) == ("server_error", "internal_error", "u1")
    assert "database" in error["message"]
    monkeypatch.undo()
    await peer.proves_alive()
    await peer.close()
