"""Recorded human speech with its transcripts: the LibriVox sentences of Debian's pocketsphinx-testdata.

Installed by ``scripts/install-system.sh test``. Synthetic espeak-ng speech is no test of recognition
(PocketSphinx scores 80-100 % WER on it), so recognition tests read these.
"""

from __future__ import annotations

from pathlib import Path

import soundfile

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")


def sentence_path(number: str) -> Path:
    """The wav (16 kHz mono) of sentence ``number`` ("0870", "0880", "0890", "0920", "0930")."""
    path = LIBRIVOX / f"sense_and_sensibility_01_austen_64kb-{number}.wav"
    assert path.exists(), f"{path} is missing: install the Debian package pocketsphinx-testdata"
    return path


def sentence(number: str):
    """(int16 samples, rate) of sentence ``number``."""
    samples, rate = soundfile.read(sentence_path(number), dtype="int16")
    return samples, rate


def transcript(number: str) -> str:
    """The reference transcript of sentence ``number`` (lower case, no punctuation)."""
    for line in (LIBRIVOX / "transcription").read_text().splitlines():
        if line.endswith(f"-{number})"):
            return line.split("<s>", 1)[1].split("</s>", 1)[0].strip()
    raise AssertionError(f"no transcript for sentence {number}")
