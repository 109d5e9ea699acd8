"""Audio through the echo engine: base64 and binary, reframing, resampling, f32, transcripts."""

import re

import numpy as np
import pytest

from tests.webapp.realtime.realtime_helpers import FRAME, assert_echo, from_pcm16, ready_peer, to_pcm16, tone

pytestmark = pytest.mark.django_db(transaction=True)


async def test_base64_round_trip_and_response_lifecycle(alice):
    peer, _ = await ready_peer(alice)
    await peer.prime()
    signal = tone(FRAME * 6)
    frames = await peer.stream(to_pcm16(signal), chunk_bytes=FRAME * 2)
    assert all(len(f) == FRAME * 2 for f in frames)  # pcm16 at 24 kHz, one engine chunk each
    assert_echo(signal, frames)
    types = [e["type"] for e in peer.seen if isinstance(e, dict)]
    first_delta = types.index("response.output_audio.delta")
    assert types[:first_delta][-4:] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert types.count("response.created") == 1  # one long-lived response
    deltas = [e for e in peer.seen if isinstance(e, dict) and e["type"] == "response.output_audio.delta"]
    assert len({(d["response_id"], d["item_id"]) for d in deltas}) == 1
    await peer.close()


async def test_first_audio_is_not_lost(alice):
    peer, _ = await ready_peer(alice)
    signal = tone(FRAME * 4)
    await peer.append(to_pcm16(signal))  # the very first audio of the session opens the slot
    assert_echo(signal, await peer.audio_frames(12))
    await peer.close()


async def test_transcript_deltas_come_with_the_audio(alice):
    peer, _ = await ready_peer(alice)
    await peer.prime()
    await peer.stream(to_pcm16(tone(FRAME * 4)), chunk_bytes=FRAME * 2)
    texts = [e for e in peer.seen if isinstance(e, dict) and e["type"] == "response.output_audio_transcript.delta"]
    assert len(texts) >= 4
    assert all(re.fullmatch(r"\[frame \d+\] ", t["delta"]) for t in texts)
    audio = next(e for e in peer.seen if isinstance(e, dict) and e["type"] == "response.output_audio.delta")
    assert {t["response_id"] for t in texts} == {audio["response_id"]}
    await peer.close()


async def test_any_append_length_is_reframed(alice):
    peer, _ = await ready_peer(alice)
    await peer.prime()
    signal = tone(FRAME * 6)
    # 1000-sample appends (not a multiple of the 1920-sample chunk), one odd 7-sample append.
    pcm = to_pcm16(signal)
    await peer.append(pcm[:14])
    frames = await peer.stream(pcm[14:], chunk_bytes=2000)
    assert_echo(signal, frames)
    await peer.close()


async def test_binary_audio_in_and_out(alice):
    peer, _ = await ready_peer(alice)
    await peer.send({"type": "session.update", "session": {"duplex": {"binary_audio": True}}})
    assert (await peer.until("session.updated"))["session"]["duplex"]["binary_audio"] is True
    await peer.prime(binary=True)
    signal = tone(FRAME * 5)
    frames = await peer.stream(to_pcm16(signal), chunk_bytes=FRAME * 2, binary=True)
    assert not any(isinstance(e, dict) and e["type"] == "response.output_audio.delta" for e in peer.seen)
    assert any(isinstance(e, bytes) and e[0] == 0x01 for e in peer.seen)
    assert_echo(signal, frames)
    await peer.close()


async def test_float32_input_format(alice):
    peer, _ = await ready_peer(alice)
    fmt = {"type": "audio/pcm-f32", "rate": 24000}
    await peer.send({"type": "session.update", "session": {"audio": {"input": {"format": fmt}}}})
    assert (await peer.until("session.updated"))["session"]["audio"]["input"]["format"] == fmt
    await peer.prime(np.zeros(FRAME, "<f4").tobytes())
    signal = tone(FRAME * 5)
    frames = await peer.stream(signal.astype("<f4").tobytes(), chunk_bytes=FRAME * 4, frame_bytes=FRAME * 4)
    assert_echo(signal, frames)
    await peer.close()


async def test_16khz_input_is_resampled_to_24khz_frames(alice):
    peer, _ = await ready_peer(alice)
    fmt = {"type": "audio/pcm", "rate": 16000}
    await peer.send({"type": "session.update", "session": {"audio": {"input": {"format": fmt}}}})
    await peer.until("session.updated")
    await peer.prime(bytes(1280 * 2))  # 80 ms at 16 kHz
    seconds, amplitude = 2.0, 0.3
    signal16 = tone(int(16000 * seconds), rate=16000, amplitude=amplitude)
    flush = bytes(1280 * 2 * 2)  # trailing silence pushes the resampler's and framer's last samples out
    frames = await peer.stream(to_pcm16(signal16) + flush, chunk_bytes=1280 * 2, frame_bytes=1280 * 2, lead=0)
    assert all(len(f) == FRAME * 2 for f in frames)
    loud = [f for f in frames if np.abs(from_pcm16(f)).max() > 0.01]  # above the filter's ringing
    # (lead=0: a standing input queue would be trimmed by the worker's latency control.)
    # 2 s at 24 kHz is 25 frames of 1920 samples; the resampler's delay may straddle one more.
    assert 25 <= len(loud) <= 26, len(loud)
    out = np.concatenate([from_pcm16(f) for f in loud])
    energy_s = float(np.sum(out**2)) / (24000 * amplitude**2 / 2)  # seconds of tone at 24 kHz
    assert abs(energy_s - seconds) < 0.05, energy_s
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * 24000 / len(out) - 440) < 15  # the pitch survives resampling
    await peer.close()
