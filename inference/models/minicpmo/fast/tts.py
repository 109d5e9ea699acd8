"""The MiniCPMTTS head over a static KV pool, decoding the units of several sessions in one batched step.

``generate_units`` is ``MiniCPMTTS.generate_unit`` for many sessions at once: the sessions' conditions are
fed together (``RunGraphs``: padded to a length bucket), then every code step feeds all the sessions' last codes
together (one graph replay, the codes never leaving the device) and samples them together on the device with the
same arithmetic (temperature, repetition penalty over the unit's last 16 codes, eos masked below
``min_new_codes``, argmax of the softmax).

The host reads nothing per step. Whether every row has reached eos is read only every ``EOS_READ_EVERY`` steps
and only once some row may stop (in the middle of a turn ``min_new_codes`` masks eos for the whole unit, so a
speaking unit usually reads nothing until its 25 codes are done). A row that has stopped keeps being fed until
that read: its extra keys land past its position, where the next feed overwrites them before anything attends
to them, and its extra codes are cut off at its eos.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch.nn import functional as F

from inference.models.minicpmo.fast.decoder import KVPool, RowDecoder
from inference.models.minicpmo.fast.graphs import RunGraphs, StepGraphs
from inference.models.minicpmo.tts import MAX_NEW_CODES, REPETITION_PENALTY, REPETITION_WINDOW, TEMPERATURE, MiniCPMTTS

EOS_READ_EVERY = 4  # steps between the host's checks that every row has stopped


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
        invariant: reduce through the row-invariant kernels (CUDA; see ``RowDecoder``).
    """

    def __init__(
        self,
        tts: MiniCPMTTS,
        *,
        num_slots: int,
        max_rows: int,
        invariant: bool = False,
    ):
        self.tts = tts
        self.cfg = tts.cfg
        self.eos = tts.eos
        self.decoder = RowDecoder(tts.model, invariant=invariant)
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
        slots, first_pos = [s.slot for s in states], [s.pos for s in states]
        min_codes = torch.tensor(list(min_new_codes), device=device)
        temperature = torch.tensor(TEMPERATURE, dtype=torch.float32)  # the eager path's float32 division
        codes = torch.zeros(n, MAX_NEW_CODES, dtype=torch.long, device=device)
        # first t at which each row chose eos (MAX_NEW_CODES - 1 if never: its 26th code is dropped)
        stop = torch.full((n,), MAX_NEW_CODES - 1, dtype=torch.long, device=device)
        steps = MAX_NEW_CODES
        for t in range(MAX_NEW_CODES):
            if t > 0:
                # every row is fed its previous code at its own next position (stopped rows too, see above)
                _, step_logits = self.graphs.step(slots, codes[:, t - 1], [p + t - 1 for p in first_pos])
                logits = step_logits / temperature
                window = codes[:, max(0, t - REPETITION_WINDOW) : t]
                freq = torch.zeros(n, V, dtype=torch.long, device=device)
                freq.scatter_add_(1, window, torch.ones_like(window))
                alpha = torch.pow(REPETITION_PENALTY, freq)
                logits = torch.where(logits < 0, logits * alpha, logits / alpha)
            else:
                logits = logits / temperature
            logits[:, self.eos] = torch.where(t < min_codes, -torch.inf, logits[:, self.eos])
            chosen = torch.argmax(F.softmax(logits, dim=-1), dim=-1)  # [n]
            codes[:, t] = chosen
            stop = torch.where((chosen == self.eos) & (stop > t), t, stop)
            can_stop = t >= min(min_new_codes) and t < MAX_NEW_CODES - 1
            if can_stop and (t + 1) % EOS_READ_EVERY == 0 and bool((stop <= t).all()):
                steps = t + 1
                break
        host_codes, host_stop = codes[:, :steps].tolist(), stop.tolist()  # the unit's one read
        for state, t_stop in zip(states, host_stop, strict=True):
            state.pos += t_stop  # codes fed: those before its eos (or the first 25)
        return [row[:t_stop] for row, t_stop in zip(host_codes, host_stop, strict=True)]
