"""Transcription behind one interface: PocketSphinx on recorded human speech; Whisper through a test double."""

from __future__ import annotations

from types import SimpleNamespace

import jiwer
import numpy as np
import pytest

from inference.speech.transcribe import (
    PocketSphinxTranscriber,
    TranscriptionError,
    WhisperTranscriber,
    transcriber_for,
)
from tests.librivox import sentence, transcript

ACCEPTANCE = ("0870", "0890", "0920")
MAX_MEAN_WER = 0.35


def test_pocketsphinx_transcribes_librivox_sentences_within_the_word_error_budget():
    transcriber = PocketSphinxTranscriber()
    rates = []
    for number in ACCEPTANCE:
        samples, rate = sentence(number)
        words = transcriber.transcribe(samples, rate)
        starts = [w.start for w in words]
        assert starts == sorted(starts) and all(0 <= w.start < w.end <= len(samples) / rate + 0.02 for w in words)
        rates.append(jiwer.wer(transcript(number), " ".join(w.text for w in words)))
    assert sum(rates) / len(rates) <= MAX_MEAN_WER, rates


def test_silence_is_no_words():
    assert PocketSphinxTranscriber().transcribe(np.zeros(16_000, np.int16), 16_000) == []
    assert PocketSphinxTranscriber().transcribe(np.zeros(0, np.int16), 16_000) == []


class WhisperModelTestDouble:
    """A test double of faster_whisper.WhisperModel: no weights here, so the interface is exercised on it."""

    def __init__(self, weights: str):
        self.weights = weights
        self.heard: np.ndarray | None = None

    def transcribe(self, audio, word_timestamps=False):
        assert word_timestamps, "the transcriber asks for word times"
        self.heard = audio
        word = SimpleNamespace
        segment = SimpleNamespace(
            words=[word(word=" Hello", start=0.5, end=0.9), word(word=" world.", start=1.0, end=1.4)]
        )
        return iter([segment]), SimpleNamespace(language="en")


def test_whisper_maps_its_word_timestamps_and_hears_16_khz_floats():
    models = []

    def factory(weights):
        models.append(WhisperModelTestDouble(weights))
        return models[-1]

    transcriber = WhisperTranscriber("/srv/whisper-small", model_factory=factory)
    words = transcriber.transcribe(np.full(48_000, 1000, np.int16), 48_000)
    assert [(w.text, w.start, w.end) for w in words] == [("Hello", 0.5, 0.9), ("world.", 1.0, 1.4)]
    heard = models[0].heard
    assert models[0].weights == "/srv/whisper-small" and heard.dtype == np.float32 and len(heard) == 16_000
    transcriber.transcribe(np.full(16_000, 1000, np.int16), 16_000)
    assert len(models) == 1  # loaded once


def test_whisper_weights_that_do_not_load_are_a_typed_error():
    def broken(weights):
        raise OSError("no model.bin")

    with pytest.raises(TranscriptionError, match="could not be loaded"):
        WhisperTranscriber("/nowhere", model_factory=broken).transcribe(np.ones(16_000, np.int16), 16_000)


def test_configuration_picks_the_engine():
    assert isinstance(transcriber_for("auto"), PocketSphinxTranscriber)
    assert isinstance(transcriber_for("auto", whisper_weights="/srv/w"), WhisperTranscriber)
    assert isinstance(transcriber_for("pocketsphinx", whisper_weights="/srv/w"), PocketSphinxTranscriber)
    assert transcriber_for("off") is None
    with pytest.raises(TranscriptionError):
        transcriber_for("whisper")
    with pytest.raises(TranscriptionError):
        transcriber_for("kaldi")
    with pytest.raises(TranscriptionError):
        PocketSphinxTranscriber().transcribe(np.zeros((10, 2), np.int16), 16_000)
