"""Is a given phrase spoken in a clip? Keyword spotting with PocketSphinx's bundled US-English model.

Used to verify a voice clone's consent recording: the person must read the random phrase the form
showed them, so a replayed or unrelated recording is refused. Keyword spotting (rather than a full
transcript compared with the sentence) tolerates the rest of the sentence being misrecognised, which
the small embedded model often does, while a phrase of three random words is unlikely to be "heard" in
speech that does not contain it. PocketSphinx ships its model inside the wheel: nothing is downloaded.
"""

from __future__ import annotations

import numpy as np

from inference.media_probe import VoiceClipError
from inference.speech.transcribe import TranscriptionError, as_int16

SPOTTING_RATE = 16_000  # the bundled acoustic model's rate
# Detection threshold of the key phrase (a likelihood ratio; smaller accepts more). On the LibriVox
# sentences of pocketsphinx-testdata, 1e-30 to 1e-10 all find "john dashwood" in 0870 and nowhere else.
KWS_THRESHOLD = 1e-20
MAX_SEARCH_S = 60.0  # a consent sentence is short; a long upload is searched from its start only


def unknown_words(phrase: str) -> list[str]:
    """The words of ``phrase`` the bundled pronouncing dictionary lacks (they could never be spotted)."""
    decoder = _decoder(None)
    return [word for word in _words(phrase) if decoder.lookup_word(word) is None]


def phrase_heard(pcm: np.ndarray, rate: int, phrase: str) -> bool:
    """Whether ``phrase`` is spoken in ``pcm`` (mono, float in [-1, 1] or int16, at ``rate`` Hz).

    Raises:
        VoiceClipError: ``phrase_unknown`` when the phrase is empty or has a word the model cannot know.
    """
    words = _words(phrase)
    if not words:
        raise VoiceClipError("there is no phrase to listen for", code="phrase_unknown")
    missing = unknown_words(phrase)
    if missing:
        raise VoiceClipError(
            f"the phrase has words the recogniser does not know: {', '.join(missing)}", code="phrase_unknown"
        )
    audio = _as_int16_16k(np.asarray(pcm), rate)
    if not audio.size:
        return False
    decoder = _decoder(" ".join(words))
    decoder.start_utt()
    decoder.process_raw(audio.tobytes(), no_search=False, full_utt=True)
    decoder.end_utt()
    return decoder.hyp() is not None


def require_phrase(pcm: np.ndarray, rate: int, phrase: str) -> None:
    """Raises ``VoiceClipError`` ``phrase_not_heard`` unless ``phrase`` is spoken in ``pcm``."""
    if not phrase_heard(pcm, rate, phrase):
        raise VoiceClipError(
            f'the phrase "{" ".join(_words(phrase))}" was not heard in it: read the whole sentence shown, clearly',
            code="phrase_not_heard",
        )


def _words(phrase: str) -> list[str]:
    return [w for w in "".join(c if c.isalpha() or c == "'" else " " for c in phrase.lower()).split() if w]


def _as_int16_16k(pcm: np.ndarray, rate: int) -> np.ndarray:
    try:
        return as_int16(pcm[: int(MAX_SEARCH_S * rate)] if rate > 0 else pcm, rate, SPOTTING_RATE)
    except TranscriptionError as exc:
        raise VoiceClipError(exc.message, code="corrupted") from exc


def _decoder(keyphrase: str | None):
    from pocketsphinx import Decoder  # imported on use: only voice creation and post-processing need it

    if keyphrase is None:
        return Decoder(loglevel="FATAL")
    return Decoder(keyphrase=keyphrase, kws_threshold=KWS_THRESHOLD, loglevel="FATAL")
