"""Chat mode on MiniCPM-o 4.5: prefill a whole conversation, greedy-decode the reply, speak it piece by piece.

The prompt is the checkpoint's ChatML, built from ids rather than rendered from the chat template as a
string, so that text a person typed stays text even when it spells a control token::

    <|im_start|>system\\n{persona}[\\n<|audio_start|>{voice}<|audio_end|>]<|im_end|>\\n
    <|im_start|>user\\n[<image>{64 embeddings}</image>][<|audio_start|>{10/s}<|audio_end|>]{text}<|im_end|>\\n
    <|im_start|>assistant\\n{text}<|im_end|>\\n ...
    <|im_start|>assistant\\n   <- the reply is decoded from here

Every ``PIECE_TOKENS`` decoded ids become one piece: their text, and their speech through the same TTS
condition and vocoder stream as a duplex unit (``DuplexRunner.speak_begin``). Nothing outlives the reply:
the conversation is prefilled afresh for each response, so the slot is held only while it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from inference.contracts import ChatMessage
from inference.models.minicpmo.duplex import DuplexRunner, DuplexSession, SpeakRequest
from inference.models.minicpmo.vision import FrameError, decode_frame
from inference.models.minicpmo.vocoder import SilentVocoder, Token2WavVocoder

PIECE_TOKENS = 10  # decoded ids per piece (about one second of speech)
MIN_AUDIO_SAMPLES = 1600  # 0.1 s at 16 kHz: shorter clips are refused by the session first
REPLY_MARGIN = 16  # positions kept free beyond the reply's cap


class ChatInputError(ValueError):
    """A message part the model cannot take (an undecodable image, a clip too short)."""


@dataclass(frozen=True)
class ChatPiece:
    """A piece of the reply: its text delta, its 24 kHz speech, and whether the reply ends with it."""

    text: str
    audio: np.ndarray
    end_of_turn: bool
    cut_off: bool = False  # the reply ended at its length cap, not at a stop id


@dataclass
class _Prompt:
    pieces: list[torch.Tensor]  # [T_i, D] embeddings, in order
    lengths: list[int]  # positions of each message (index 0: the system prompt)


class ChatReply:
    """One reply: ``pieces()`` yields ``ChatPiece``s, the last with ``end_of_turn``.

    Args:
        runner: the loaded model's duplex runner (its tokenizer, special ids, model parts and TTS helpers).
        vocoder: the engine's vocoder.
        messages: the conversation so far, its last message the one to answer.
        max_tokens: the reply's cap in text ids.
        system_prompt: the persona, or the engine's default.
        ref_audio: the voice reference at 16 kHz, or None.
    """

    def __init__(
        self,
        runner: DuplexRunner,
        vocoder: SilentVocoder | Token2WavVocoder,
        messages: tuple[ChatMessage, ...],
        max_tokens: int,
        system_prompt: str,
        ref_audio: np.ndarray | None,
    ):
        self.runner, self.parts, self.ids, self.tok = runner, runner.parts, runner.ids, runner.tok
        self.vocoder, self.messages, self.max_tokens = vocoder, messages, max_tokens
        self.system_prompt, self.ref_audio = system_prompt, ref_audio
        stops = {self.ids.im_end, self.ids.turn_eos, self.ids.chunk_eos, self.ids.listen, self.ids.chunk_tts_eos}
        eos = getattr(self.tok, "eos_token_id", None)
        if isinstance(eos, int):
            stops.add(eos)
        self.stops = stops
        vocab = self.parts.config.vocab_size
        added = {int(i) for i in getattr(self.tok, "added_tokens_decoder", {})}
        banned = (added | set(self.parts.bad_token_ids) | {self.ids.tts_pad}) - stops
        device = self.parts.device
        self.banned = torch.tensor(sorted(i for i in banned if 0 <= i < vocab), dtype=torch.long, device=device)
        self.stop_ids = torch.tensor(sorted(i for i in stops if 0 <= i < vocab), dtype=torch.long, device=device)

    # ---- prompt -------------------------------------------------------------------------------------------

    def _text(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False, split_special_tokens=True) if text else []

    def _embed(self, ids: list[int]) -> torch.Tensor:
        return self.parts.llm.embed_ids(ids)

    def _dtype(self) -> torch.dtype:
        return self.parts.llm.llm.model.embed_tokens.weight.dtype

    def _message(self, message: ChatMessage) -> list[torch.Tensor]:
        ids = self.ids
        out = [self._embed([ids.im_start, *self._text(f"{message.role}\n")])]
        if message.image is not None:
            cfg = self.parts.config
            try:
                frame = decode_frame(message.image, cfg.image_size, cfg.vision.patch_size)
                image = self.parts.vision.embed_frame(frame)
            except FrameError as exc:
                raise ChatInputError(str(exc)) from exc
            out += [self._embed([ids.image]), image.to(self._dtype()), self._embed([ids.image_end])]
        if message.audio is not None:
            clip = np.frombuffer(message.audio, dtype="<i2").astype(np.float32) / 32768.0
            if message.audio_rate != 16_000:
                from inference.audio.resample import resample_clip  # soxr, imported only where it is needed

                clip = resample_clip(clip, message.audio_rate, 16_000)
            if clip.size < MIN_AUDIO_SAMPLES:
                raise ChatInputError("an audio clip must last at least 0.1 s")
            audio = self.parts.audio.embed_reference(clip)
            out += [self._embed([ids.audio_start]), audio.to(self._dtype()), self._embed([ids.audio_end])]
        out.append(self._embed([*self._text(message.text), ids.im_end, *self._text("\n")]))
        return out

    def prompt(self) -> _Prompt:
        """The conversation's embeddings; the oldest messages are left out when it would not fit."""
        ids = self.ids
        system = [self._embed([ids.im_start, *self._text(f"system\n{self.system_prompt}")])]
        if self.ref_audio is not None:
            ref = self.parts.audio.embed_reference(np.asarray(self.ref_audio, dtype=np.float32))
            system += [
                self._embed([*self._text("\n"), ids.audio_start]),
                ref.to(self._dtype()),
                self._embed([ids.audio_end]),
            ]
        system.append(self._embed([ids.im_end, *self._text("\n")]))
        messages = [self._message(m) for m in self.messages]
        tail = [self._embed([ids.im_start, *self._text("assistant\n")])]
        budget = self.runner.window_max - self.max_tokens - REPLY_MARGIN  # within the runner's cache capacity
        size = lambda group: sum(int(t.shape[0]) for t in group)  # noqa: E731
        while len(messages) > 1 and size(system) + sum(map(size, messages)) + size(tail) > budget:
            messages.pop(0)  # the oldest message goes first; the newest always stays
        flat = [t for group in (system, *messages, tail) for t in group]
        return _Prompt(flat, [size(system), *map(size, messages)])

    # ---- reply ----------------------------------------------------------------------------------------------

    def _choose(self, logits: torch.Tensor, first: bool) -> int:
        scores = logits.clone()
        scores[self.banned] = -torch.inf
        if first:  # a reply says something: its first id is never a stop
            scores[self.stop_ids] = -torch.inf
        return int(torch.argmax(scores))  # greedy; ties go to the lowest id

    @torch.inference_mode()
    def pieces(self) -> Iterator[ChatPiece]:
        llm = self.parts.llm
        session = self.runner.new_session()  # the runner's own caches (static pools on the fast path)
        vocoder_state = self.vocoder.new_state(self.ref_audio)
        prompt = self.prompt()
        hidden = llm.feed(session.llm_cache, torch.cat(prompt.pieces, dim=0))
        logits = llm.logits(hidden[-1])
        del prompt, hidden
        reply: list[int] = []
        sent = ""
        text_ids: list[int] = []
        text_hidden: list[torch.Tensor] = []
        done = cut_off = False
        while not done:
            token = self._choose(logits, first=not reply)
            if token in self.stops:
                done = True
            else:
                reply.append(token)
                step_hidden = llm.feed(session.llm_cache, self._embed([token]))[-1]
                logits = llm.logits(step_hidden)
                text_ids.append(token)
                text_hidden.append(step_hidden)
                done = cut_off = len(reply) >= self.max_tokens
            if len(text_ids) < PIECE_TOKENS and not done:
                continue
            text = self.tok.decode(reply, skip_special_tokens=True)
            delta = ""
            if done or not text.endswith("\ufffd"):  # else a character split across ids goes with the next piece
                delta = text[len(sent) :] if text.startswith(sent) else text
                sent = text
            piece = self._speak(session, vocoder_state, text_ids, text_hidden, delta, end_of_turn=done)
            yield replace(piece, cut_off=cut_off)
            text_ids, text_hidden = [], []

    def _speak(
        self,
        session: DuplexSession,
        vocoder_state,
        text_ids: list[int],
        text_hidden: list[torch.Tensor],
        delta: str,
        *,
        end_of_turn: bool,
    ) -> ChatPiece:
        speak = SpeakRequest(text_ids, text_hidden, end_of_turn)
        condition, min_codes = self.runner.speak_begin(session, speak)
        codes = self.parts.tts.generate_unit(session.tts, condition, min_codes)
        self.runner.speak_end(session, speak)
        audio = self.vocoder.synthesize(vocoder_state, codes, end_of_turn=end_of_turn)
        return ChatPiece(delta, audio, end_of_turn)
