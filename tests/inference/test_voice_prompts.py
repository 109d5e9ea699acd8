"""Voice clips -> prompts: every accepted format, every refusal with its code, and prompts equal to what the
engines compute themselves. Clips are made here with PyAV / soundfile (real encoders, real containers)."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile
import torch

from inference import api
from inference.models.moshi.codes_prompt import read_codes_prompt
from inference.voice_prompts import (
    MAX_UPLOAD_BYTES,
    VoiceClipError,
    compute_prompt,
    convert_pt_prompt,
    prepare_clip,
    prompt_targets,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")  # tests/conftest.py

DATA = Path(__file__).resolve().parents[1] / "data" / "personaplex"
RATE = 48_000


def speech(seconds: float, amp: float = 0.3, rate: int = RATE) -> np.ndarray:
    """A voiced, syllable-like signal: a gliding tone under a 3 Hz envelope."""
    t = np.arange(int(seconds * rate)) / rate
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 3 * t))
    return (amp * envelope * np.sin(2 * np.pi * (180 + 40 * np.sin(2 * np.pi * 0.7 * t)) * t)).astype(np.float32)


def padded(x: np.ndarray, silence_s: float = 1.0) -> np.ndarray:
    pad = np.zeros(int(silence_s * RATE), np.float32)
    return np.concatenate([pad, x, pad])


def sf_bytes(x: np.ndarray, fmt: str = "WAV", subtype: str | None = None, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, x, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def av_bytes(x: np.ndarray, container: str, codec: str) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=RATE)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(x.reshape(1, -1), format="flt", layout="mono")
        frame.rate = RATE
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue()


def video_without_audio() -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="webm") as out:
        stream = out.add_stream("libvpx", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(10):
            image = np.full((48, 64, 3), i * 20, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


CLIP = padded(speech(6.0))


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: sf_bytes(CLIP), id="wav"),
        pytest.param(lambda: sf_bytes(CLIP, "FLAC"), id="flac"),
        pytest.param(lambda: sf_bytes(CLIP, "OGG", "VORBIS"), id="ogg-vorbis"),
        pytest.param(lambda: av_bytes(CLIP, "ogg", "libopus"), id="ogg-opus"),
        pytest.param(lambda: av_bytes(CLIP, "webm", "libopus"), id="webm-opus"),
        pytest.param(lambda: av_bytes(CLIP, "mp3", "libmp3lame"), id="mp3"),
        pytest.param(lambda: av_bytes(CLIP, "ipod", "aac"), id="m4a"),
    ],
)
def test_every_format_becomes_a_trimmed_normalised_24k_clip(make):
    clip = prepare_clip(make())
    assert 6.0 <= clip.speech_s <= 6.5, "1 s of silence on each side is trimmed (a little padding stays)"
    assert clip.source_s == pytest.approx(8.0, abs=0.1)
    pcm, rate = soundfile.read(io.BytesIO(clip.wav), dtype="float32")
    assert rate == 24_000 and pcm.ndim == 1 and len(pcm) == len(clip.pcm)
    from inference.audio.loudness import integrated_loudness

    assert integrated_loudness(pcm, 24_000) == pytest.approx(-24.0, abs=0.5)


def test_stereo_is_downmixed():
    stereo = np.stack([CLIP, CLIP * 0.5], axis=1)
    assert prepare_clip(sf_bytes(stereo)).speech_s > 6.0


def truncated_wav() -> bytes:
    data = sf_bytes(CLIP)
    return data[: len(data) // 2]


def corrupted_header() -> bytes:
    data = sf_bytes(CLIP)
    return b"RIFF" + b"\x00" * 40 + data[44:]


@pytest.mark.parametrize(
    ("make", "code", "words"),
    [
        pytest.param(lambda: b"", "empty", "empty", id="empty"),
        pytest.param(lambda: b"just some text, certainly not audio\n" * 50, "not_audio", "not an audio", id="text"),
        pytest.param(corrupted_header, "corrupted", "header", id="corrupted-header"),
        pytest.param(truncated_wav, "truncated", "truncated", id="truncated"),
        pytest.param(lambda: sf_bytes(padded(speech(40.0))), "too_long", "at most 30 s", id="too-long-speech"),
        pytest.param(lambda: sf_bytes(np.zeros(301 * 8000, np.float32), rate=8000), "too_long", "300 s", id="5-min"),
        pytest.param(lambda: sf_bytes(padded(speech(1.5))), "too_short", "at least 3 s", id="too-short"),
        pytest.param(lambda: sf_bytes(np.zeros(RATE * 5, np.float32)), "silent", "silent", id="silent"),
        pytest.param(lambda: sf_bytes(np.clip(speech(6.0, amp=3.0), -1, 1)), "clipped", "clipped", id="clipped"),
        pytest.param(lambda: b"RIFF" + bytes(MAX_UPLOAD_BYTES), "too_big", "at most 10 MB", id="too-big"),
        pytest.param(video_without_audio, "no_audio_track", "no audio track", id="video-no-audio"),
    ],
)
def test_bad_clips_are_refused_with_their_reason(make, code, words):
    with pytest.raises(VoiceClipError) as refused:
        api.prepare_voice_clip(make())
    assert refused.value.code == code
    assert words in refused.value.message


def test_progress_reports_stages_in_order():
    seen: list[tuple[str, float]] = []
    prepare_clip(sf_bytes(CLIP), progress=lambda stage, fraction: seen.append((stage, fraction)))
    stages = [stage for stage, _ in seen]
    assert stages[0] == "decoding" and stages[-1] == "normalising loudness"
    fractions = [fraction for _, fraction in seen]
    assert fractions == sorted(fractions)


# ---- PersonaPlex .pt prompts ----------------------------------------------------------------------------


def test_a_personaplex_pt_becomes_safetensors_with_the_same_tensors():
    from safetensors.torch import load

    original = torch.load(DATA / "voice_prompt.pt", weights_only=True)
    converted = load(convert_pt_prompt((DATA / "voice_prompt.pt").read_bytes()))
    assert set(converted) == {"embeddings", "cache"}
    torch.testing.assert_close(converted["embeddings"], original["embeddings"].float(), rtol=0, atol=0)
    assert torch.equal(converted["cache"], original["cache"].long())


class Payload:
    def __reduce__(self):  # what a malicious .pt does: run code when unpickled
        return (print, ("unpickled!",))


def torch_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: torch_bytes({"embeddings": Payload(), "cache": torch.zeros(1, 17, 4)}), id="object"),
        pytest.param(lambda: pickle.dumps({"embeddings": 1}), id="plain-pickle"),
        pytest.param(lambda: torch_bytes({"weights": torch.zeros(3)}), id="other-tensors"),
        pytest.param(lambda: torch_bytes([torch.zeros(3)]), id="a-list"),
        pytest.param(lambda: torch_bytes({"embeddings": torch.zeros(2, 64), "cache": torch.zeros(1, 17, 4)}),
                     id="wrong-shape"),  # fmt: skip
        pytest.param(lambda: b"not a torch file at all", id="garbage"),
    ],
)
def test_a_pt_that_is_not_a_voice_prompt_is_refused(make, capsys):
    with pytest.raises(VoiceClipError) as refused:
        convert_pt_prompt(make())
    assert refused.value.code == "bad_prompt" and "Not a PersonaPlex voice prompt" in refused.value.message
    assert "unpickled!" not in capsys.readouterr().out, "weights_only must refuse to run the pickle's code"


# ---- prompts equal what the engines compute ---------------------------------------------------------------


def test_lockstep_codes_equal_the_engines_own_wav_encoding(tmp_path):
    """The stored prompt is exactly what the engine computes from the processed .wav (load_voice_wav + Mimi)."""
    from inference.models.moshi.audio_prep import load_voice_wav
    from inference.models.moshi.config import read_checkpoint_dir
    from inference.models.moshi.personaplex import iter_voice_frames_from_pcm, voice_frames_from_codes
    from inference.voice_prompts import _mimi_for

    checkpoint = DATA / "ckpt"
    (target,) = prompt_targets("personaplex", checkpoint)
    assert target.family == "lockstep" and target.model_key.startswith("mimi-")
    wav = tmp_path / "voice.wav"
    wav.write_bytes(prepare_clip(sf_bytes(padded(speech(3.5)))).wav)
    stored = tmp_path / "prompt.safetensors"
    stored.write_bytes(compute_prompt(wav, target))

    codes = read_codes_prompt(stored)
    assert codes.shape == (8, -(-len(load_voice_wav(wav)) // 1920))
    # the engine's own .wav prefill frames (the same Mimi, lazily encoded) equal the frames from the stored codes
    lm = read_checkpoint_dir(checkpoint).lm
    engine_frames = list(iter_voice_frames_from_pcm(_mimi_for(checkpoint), load_voice_wav(wav), lm))
    stored_frames = voice_frames_from_codes(lm, codes)
    assert len(engine_frames) == len(stored_frames) == codes.shape[1] - 1
    for ours, theirs in zip(stored_frames, engine_frames, strict=True):
        assert torch.equal(ours.forced, theirs.forced) and torch.equal(ours.forced_mask, theirs.forced_mask)
    assert read_codes_prompt(DATA / "voice_prompt.safetensors") is None, "an embeddings prompt is not codes"


def test_unit_engine_embedding_is_the_encoders_reference_embedding(tmp_path, minicpmo_checkpoint):
    from safetensors.torch import load

    from inference.engines.unit import load_reference_audio
    from inference.models.minicpmo.loading import load_model

    (target,) = prompt_targets("minicpmo", minicpmo_checkpoint)
    wav = tmp_path / "voice.wav"
    wav.write_bytes(prepare_clip(sf_bytes(padded(speech(3.5)))).wav)
    stored = load(compute_prompt(wav, target))["embedding"]
    with torch.no_grad():
        expected = load_model(minicpmo_checkpoint).audio.embed_reference(load_reference_audio(wav))
    torch.testing.assert_close(stored, expected.float())
    assert stored.shape[-2] > 0


def test_no_prompt_targets_for_the_echo_engine():
    assert prompt_targets("echo", None) == []


@pytest.fixture(scope="module")
def minicpmo_checkpoint(tmp_path_factory) -> Path:
    from inference.models.minicpmo.fill import make_checkpoint

    data = Path(__file__).resolve().parents[1] / "data" / "minicpmo45"
    return make_checkpoint(tmp_path_factory.mktemp("minicpmo-ckpt"), data_dir=data, seed=1234)
