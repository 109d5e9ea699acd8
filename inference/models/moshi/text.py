"""The inner monologue as transcript deltas: text tokens -> strings, as the moshi server shows them."""

from __future__ import annotations

from collections.abc import Iterable

TEXT_EPAD = 0  # end of padding
TEXT_PAD = 3  # padding (no text this frame)
SILENT_TEXT_IDS = frozenset({TEXT_EPAD, TEXT_PAD})


class TextDetokenizer:
    """Turns one text token per frame into transcript deltas.

    Args:
        tokenizer: a ``sentencepiece.SentencePieceProcessor`` (anything with ``id_to_piece`` and
            ``get_piece_size``).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.get_piece_size())

    def piece(self, token: int) -> str:
        """The delta for one token: '' for PAD/EPAD and ids outside the vocabulary, '▁' shown as a space."""
        token = int(token)
        if token in SILENT_TEXT_IDS or not 0 <= token < self.vocab_size:
            return ""
        if self.tokenizer.is_control(token) or self.tokenizer.is_unknown(token):
            return ""
        return self.tokenizer.id_to_piece(token).replace("\u2581", " ")

    def text(self, tokens: Iterable[int]) -> str:
        """The concatenated deltas of a token sequence."""
        return "".join(self.piece(t) for t in tokens)
