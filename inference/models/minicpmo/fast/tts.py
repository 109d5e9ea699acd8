"""The MiniCPMTTS head over a static KV pool, decoding the units of several sessions in one batched step.

``generate_units`` is ``MiniCPMTTS.generate_unit`` for many sessions at once: the sessions' conditions are
fed together (``RunGraphs``: padded to a length bucket), then every code step feeds all unfinished sessions
together (one graph replay) and samples them together on the device with the same arithmetic (temperature, repetition penalty
over the unit's last 16 codes, eos masked below ``min_new_codes``, argmax of the softmax). One host read
per step tells which sessions hit eos.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch.nn import functional as F

from inference.models.minicpmo.fast.decoder import KVPool, RowDecoder
from inference.models.minicpmo.fast.graphs import RunGraphs, StepGraphs
from inference.models.minicpmo.tts import MAX_NEW_CODES, REPETITION_PENALTY, REPETITION_WINDOW, TEMPERATURE, MiniCPMTTS


class FastTTSState:
    """One session's TTS turn: a slot of the TTS pool and the next position (``reset`` starts a new turn)."""

    def __init__(self, pool: KVPool):
        self.slot = pool.acquire()
        self.pos = 0
        self._release = weakref.finalize(self, pool.release, self.slot)

    def reset(self) -> None:
        self.pos = 0  # positions beyond pos are never read, so nothing needs clearing

    def nbytes(self) -> int:
        return 0  # the pool is preallocated; see FastTTS.pool.bytes_per_slot()


class FastTTS:
    """Static-cache TTS sharing the weights of a loaded ``MiniCPMTTS``.

    Args:
        tts: the loaded TTS head (``bake()`` already applied).
        num_slots: sessions served at once.
        max_rows: the most sessions one step takes.
    """

    def __init__(self, tts: MiniCPMTTS, *, num_slots: int, max_rows: int):
        self.tts = tts
        self.cfg = tts.cfg
        self.eos = tts.eos
        self.decoder = RowDecoder(tts.model)
        self.pool = self.decoder.new_pool(num_slots, tts.cfg.max_position_embeddings)
        self.graphs = StepGraphs(
            self.decoder,
            self.pool,
            embed=tts.emb_code[0],
            head=tts.head_code[0],
            vocab=tts.cfg.num_audio_tokens,
            max_rows=max_rows,
        )
        self.runs = RunGraphs(
            self.decoder, self.pool, head=tts.head_code[0], vocab=tts.cfg.num_audio_tokens, max_rows=max_rows
        )

    def new_state(self) -> FastTTSState:
        return FastTTSState(self.pool)

    def condition(self, text_ids: list[int], hidden: torch.Tensor | None) -> torch.Tensor:
        return self.tts.condition(text_ids, hidden)

    def generate_unit(self, state: FastTTSState, condition: torch.Tensor, min_new_codes: int) -> list[int]:
        return self.generate_units([state], [condition], [min_new_codes])[0]

    @torch.inference_mode()
    def generate_units(
        self, states: Sequence[FastTTSState], conditions: Sequence[torch.Tensor], min_new_codes: Sequence[int]
    ) -> list[list[int]]:
        """Codes of one unit for each session (see ``MiniCPMTTS.generate_unit``); advances each ``state.pos``."""
        n = len(states)
        if n == 0:
            return []
        # Every condition in one padded, graphed forward (one per length bucket): last-row logits [n, V].
        _, logits = self.runs.run([s.slot for s in states], conditions, [s.pos for s in states])
        for state, condition in zip(states, conditions, strict=True):
            state.pos += condition.shape[0]
        device = logits.device
        V = logits.shape[1]
        temperature = torch.tensor(TEMPERATURE, dtype=torch.float32)
        min_codes = torch.tensor(list(min_new_codes), device=device)
        codes = torch.zeros(n, MAX_NEW_CODES, dtype=torch.long, device=device)
        active = list(range(n))  # rows still decoding, in order
        stopped_at = [MAX_NEW_CODES - 1] * n  # t at which each row stopped (eos index, or the last t)
        for t in range(MAX_NEW_CODES):
            if t > 0:
                rows = torch.tensor(active, device=device)
                _, step_logits = self.graphs.step(
                    [states[r].slot for r in active], codes[rows, t - 1].tolist(), [states[r].pos for r in active]
                )
                for r in active:
                    states[r].pos += 1
                logits = step_logits / temperature
                window = codes[rows, max(0, t - REPETITION_WINDOW) : t]
                freq = torch.zeros(len(active), V, dtype=torch.long, device=device)
                freq.scatter_add_(1, window, torch.ones_like(window))
                alpha = torch.pow(REPETITION_PENALTY, freq)
                logits = torch.where(logits < 0, logits * alpha, logits / alpha)
            else:
                rows = torch.arange(n, device=device)
                logits = logits / temperature
            blocked = t < min_codes[rows]
            logits[:, self.eos] = torch.where(blocked, -torch.inf, logits[:, self.eos])
            chosen = torch.argmax(F.softmax(logits, dim=-1), dim=-1)  # [rows]
            codes[rows, t] = chosen
            still = []
            for r, code in zip(active, chosen.tolist(), strict=True):
                if code == self.eos:
                    stopped_at[r] = t
                else:
                    still.append(r)
            active = still
            if not active:
                break
        # A row's last computed code (its eos, or the 26th) is never fed and never returned.
        host = codes.tolist()
        return [host[r][: stopped_at[r]] for r in range(n)]
