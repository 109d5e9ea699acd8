"""Keyword spotting of the consent phrase on recorded human speech (LibriVox, pocketsphinx-testdata)."""

from __future__ import annotations

import numpy as np
import pytest

from inference.media_probe import VoiceClipError
from inference.speech.phrase_spotting import phrase_heard, require_phrase, unknown_words
from tests.librivox import sentence


def test_the_phrase_read_in_the_sentence_is_heard():
    samples, rate = sentence("0870")  # "and mister john dashwood had then leisure to consider ..."
    assert phrase_heard(samples, rate, "John Dashwood")
    require_phrase(samples, rate, "john dashwood")  # does not raise


def test_the_phrase_is_heard_after_resampling_to_another_rate():
    from scipy.signal import resample_poly

    samples, _ = sentence("0870")
    at_24k = resample_poly(samples.astype(np.float32) / 32768, 3, 2).astype(np.float32)  # as prepared clips are
    assert phrase_heard(at_24k, 24_000, "john dashwood")


@pytest.mark.parametrize("number", ["0880", "0890", "0920"])
def test_a_different_sentence_is_refused(number):
    samples, rate = sentence(number)
    assert not phrase_heard(samples, rate, "john dashwood")
    with pytest.raises(VoiceClipError) as refused:
        require_phrase(samples, rate, "john dashwood")
    assert refused.value.code == "phrase_not_heard" and "john dashwood" in refused.value.message


def test_silence_and_no_audio_are_refused():
    assert not phrase_heard(np.zeros(16_000 * 3, np.int16), 16_000, "john dashwood")
    assert not phrase_heard(np.zeros(0, np.float32), 24_000, "john dashwood")


def test_a_phrase_the_model_cannot_know_is_a_typed_error():
    assert unknown_words("amber kestrel river") == ["kestrel"]
    with pytest.raises(VoiceClipError) as refused:
        phrase_heard(np.zeros(16_000, np.int16), 16_000, "amber kestrel river")
    assert refused.value.code == "phrase_unknown"
    with pytest.raises(VoiceClipError):
        phrase_heard(np.zeros(16_000, np.int16), 16_000, " , ")


def test_every_consent_word_is_one_the_model_knows():
    from webapp.personas.services import CONSENT_WORDS

    assert unknown_words(" ".join(CONSENT_WORDS)) == []
