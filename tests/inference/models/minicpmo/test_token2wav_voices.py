"""Sessions with the same voice share its primed prompt stream (``Token2WavVocoder.new_state``): the prompt is encoded
once while a session holds it, a turn never changes it, and a voice nobody holds any more is let go."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets
from inference.models.minicpmo.vocoder import Token2WavVocoder

pytestmark = pytest.mark.usefixtures("single_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def vocoder(tmp_path_factory) -> Token2WavVocoder:
    return Token2WavVocoder(make_token2wav_assets(tmp_path_factory.mktemp("token2wav"), seed=1234), n_timesteps=5)


@pytest.fixture
def encodes(vocoder, monkeypatch) -> list[int]:
    """The lengths of the clips the vocoder encodes (the real encoder still runs)."""
    seen: list[int] = []
    encode = vocoder.prompts.encode
    monkeypatch.setattr(vocoder.prompts, "encode", lambda clip: seen.append(clip.shape[0]) or encode(clip))
    return seen


def _voice(seed: int, seconds: float = 1.5) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * (120 + 40 * seed) * t) + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


def _turn(vocoder: Token2WavVocoder, state, seed: int) -> np.ndarray:
    """Three units of one turn, the last ending it: the audio as the caller hears it."""
    rng = np.random.default_rng(seed)
    units = [rng.integers(0, 6561, 25).tolist() for _ in range(3)]
    return np.concatenate([vocoder.synthesize(state, codes, end_of_turn=u == 2) for u, codes in enumerate(units)])


def test_a_voice_in_use_is_encoded_once_and_shared(vocoder, encodes):
    clip = _voice(1)
    first = vocoder.new_state(clip)
    second = vocoder.new_state(clip.copy())  # equal samples, another array: the same voice
    other = vocoder.new_state(_voice(2))
    assert encodes == [clip.shape[0], clip.shape[0]]  # one for the shared voice, one for the other
    assert first.base_caches[0] is second.base_caches[0]
    assert other.base_caches[0] is not first.base_caches[0]
    assert first.caches[0] is not second.caches[0]  # each session's turn is its own


def test_a_turn_leaves_the_shared_prompt_as_it_was(vocoder):
    """Two sessions of one voice speaking the same codes, one after the other, sound the same: the first one's
    turns did not move the stream the second one starts from."""
    clip = _voice(3)
    first = vocoder.new_state(clip)
    heard_first = [_turn(vocoder, first, seed) for seed in (10, 11)]
    second = vocoder.new_state(clip)
    assert second.base_caches[0] is first.base_caches[0]
    heard_second = [_turn(vocoder, second, seed) for seed in (10, 11)]
    for a, b in zip(heard_first, heard_second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert float(np.abs(heard_first[0] - heard_first[1]).max()) > 0.01  # other codes, other audio


def test_a_voice_nobody_holds_is_let_go_and_the_builtin_one_is_kept(vocoder, encodes):
    builtin = vocoder.new_state(None)
    clip = _voice(4)
    state = vocoder.new_state(clip)
    del builtin, state
    gc.collect()
    vocoder.new_state(None)
    vocoder.new_state(clip)
    assert encodes.count(clip.shape[0]) == 2  # encoded again once nobody held it
    assert len(encodes) == 3  # the built-in voice: once, then kept
