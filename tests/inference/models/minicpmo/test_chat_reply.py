"""Chat mode on the tiny MiniCPM-o checkpoint: a conversation with text, an image and an audio clip is prefilled,
the reply is greedy-decoded (the same input gives the same ids) and spoken through TTS + Token2Wav."""

from __future__ import annotations

import io

import numpy as np
import pytest

from inference.contracts import ChatMessage
from inference.models.minicpmo.chat import PIECE_TOKENS, ChatInputError, ChatReply
from inference.models.minicpmo.duplex import DuplexRunner
from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets
from inference.models.minicpmo.vocoder import build_vocoder


@pytest.fixture(scope="module")
def runner(minicpmo_parts):
    return DuplexRunner(minicpmo_parts)


@pytest.fixture(scope="module")
def vocoder(tmp_path_factory):
    """Tiny random Token2Wav: the reply's speech is noise, but not silence."""
    assets = tmp_path_factory.mktemp("chat-t2w")
    make_token2wav_assets(assets / "assets" / "token2wav", seed=1234)
    return build_vocoder(assets, "cpu")


def png(width: int = 64, height: int = 48) -> bytes:
    from PIL import Image

    pixels = (np.arange(width * height * 3).reshape(height, width, 3) % 251).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def tone_pcm16(seconds: float, rate: int = 24_000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes()


def reply(runner, vocoder, messages, max_tokens=24):
    return list(ChatReply(runner, vocoder, tuple(messages), max_tokens, "You are a helpful assistant.", None).pieces())


def test_reply_is_deterministic_text_and_audio_with_a_cap(runner, vocoder):
    assert vocoder.name == "token2wav"
    messages = [ChatMessage("user", "What is in this picture?", image=png(), audio=tone_pcm16(0.5), audio_rate=24_000)]
    first = reply(runner, vocoder, messages)
    second = reply(runner, vocoder, messages)
    assert [p.text for p in first] == [p.text for p in second]
    assert all(np.array_equal(a.audio, b.audio) for a, b in zip(first, second, strict=True))
    assert first[-1].end_of_turn and not any(p.end_of_turn for p in first[:-1])
    assert "".join(p.text for p in first).strip()
    audio = np.concatenate([p.audio for p in first])
    assert audio.size > 0 and float(np.sqrt(np.mean(audio**2))) > 1e-3
    assert len(first) <= -(-24 // PIECE_TOKENS)  # the cap: 24 ids at most, PIECE_TOKENS per piece


def test_a_reply_cut_at_its_cap_says_so(runner, vocoder):
    """``cut_off`` on the last piece exactly when the cap, not a stop id, ended the reply."""
    messages = [ChatMessage("user", "Tell me a long story.")]
    free = reply(runner, vocoder, messages, max_tokens=64)
    capped = reply(runner, vocoder, messages, max_tokens=2)
    text = "".join(p.text for p in capped)
    assert capped[-1].cut_off == (text != "".join(p.text for p in free))
    assert not any(p.cut_off for p in capped[:-1] + free[:-1])


def test_history_and_parts_change_the_reply(runner, vocoder):
    plain = reply(runner, vocoder, [ChatMessage("user", "Hello")], max_tokens=8)
    with_image = reply(runner, vocoder, [ChatMessage("user", "Hello", image=png())], max_tokens=8)
    history = [ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello."), ChatMessage("user", "Hello")]
    continued = reply(runner, vocoder, history, max_tokens=8)
    texts = {"".join(p.text for p in r) for r in (plain, with_image, continued)}
    assert len(texts) == 3, texts


def test_a_message_that_is_not_an_image_is_refused(runner, vocoder):
    with pytest.raises(ChatInputError):
        reply(runner, vocoder, [ChatMessage("user", "x", image=b"\x89PNG\r\n\x1a\n" + b"not really")])
