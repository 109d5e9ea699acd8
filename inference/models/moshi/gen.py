"""Lockstep generation over a batch of slots: the token ring, forced tokens, one step, sampling.

One ``LockstepGen`` serves ``batch_size`` slots. Its state is preallocated tensors only (token ring, provided
mask, KV rings), so a step has static shapes, no host syncs and no Python branching on tensor values.

Token ring semantics (the reference's, see ``shared/reference/moshi-architecture.md`` §3 and the PersonaPlex
golden README): a ring of ``CT = max_delay + 3`` columns, column ``j`` holding frame ``j``, plus a *provided*
mask. With ``o`` = ``lengths + 1`` (the reference's offset after its hidden first call):

1. forced tokens (user codes; in a prefill also text and agent codes) go to column ``w + delay(row)`` and are
   marked provided; rows with ``w <= delay`` get the initial token at column ``w``;
2. the temporal transformer reads column ``o - 1`` and the depformer predicts column ``o``, teacher-forced
   wherever column ``o`` is provided;
3. sampled tokens are written to column ``o`` where not provided; the de-delayed frame ``o - 1`` is returned.

PersonaPlex (dep_q == n_q) writes forced tokens at ``w = o``: the user codes of a call are consumed by the
next model pass, which is what lets the depformer teacher-force the user codebooks. Moshi (dep_q < n_q)
writes them at ``w = o - 1``, so a call's user codes feed its own pass, exactly as moshi 0.2.13's ``LMGen``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.models.moshi.config import LMConfig
from inference.models.moshi.lm import MoshiLM, TemporalKV

UNGENERATED = -2


@dataclass(frozen=True)
class SamplingConfig:
    """Decoding settings; defaults are LMGen's (text 0.7 / top-k 25, audio 0.8 / top-k 250)."""

    use_sampling: bool = True
    temp: float = 0.8
    temp_text: float = 0.7
    top_k: int = 250
    top_k_text: int = 25

    @classmethod
    def from_lm_gen_config(cls, lm_gen_config: dict, *, greedy: bool = False) -> SamplingConfig:
        known = {"temp", "temp_text", "top_k", "top_k_text"}
        values = {k: v for k, v in lm_gen_config.items() if k in known}
        return cls(use_sampling=not greedy, **values)


def sample_token(
    logits: torch.Tensor, use_sampling: bool, temp: float, top_k: int, generator: torch.Generator | None
) -> torch.Tensor:
    """logits [B, V] -> [B] long. Greedy argmax, or softmax/top-k/exponential race (no host sync)."""
    if not use_sampling or temp <= 0.0:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(logits / temp, dim=-1)
    if top_k > 0:
        probs, indices = torch.topk(probs, min(top_k, probs.shape[-1]), dim=-1)
    else:
        indices = None
    race = probs / torch.empty_like(probs).exponential_(1, generator=generator)
    choice = race.argmax(dim=-1, keepdim=True)
    return (choice if indices is None else indices.gather(-1, choice))[:, 0]


@dataclass
class StepOutput:
    """One step's result for every row.

    Attributes:
        tokens: [B, 1 + dep_q] the de-delayed frame: text then the dep_q predicted codebooks.
        valid: [B] bool: the row executed and has passed the delay warm-up.
        text_logits: [B, text_card] of this pass (debugging / tests).
    """

    tokens: torch.Tensor
    valid: torch.Tensor
    text_logits: torch.Tensor


class LockstepGen:
    """Batched generation state and step for a ``MoshiLM``.

    Args:
        lm: the model (eval mode, on its device).
        batch_size: number of slots.
        sampling: decoding settings.
        generator: RNG for sampling (device generator); None uses the global one.
    """

    def __init__(
        self,
        lm: MoshiLM,
        batch_size: int,
        sampling: SamplingConfig | None = None,
        generator: torch.Generator | None = None,
    ):
        self.lm = lm
        self.config: LMConfig = lm.config
        self.sampling = sampling or SamplingConfig()
        self.generator = generator
        c = self.config
        param = lm.text_emb.weight
        self.device, self.dtype = param.device, param.dtype
        self.batch_size = batch_size
        self.ct = c.max_delay + 3
        self.delays = torch.tensor(c.delays, device=self.device, dtype=torch.long)  # [K]
        initial = [c.text_card] + [c.card] * c.n_q
        self.initial = torch.tensor(initial, device=self.device, dtype=torch.long)  # [K]
        K = c.num_codebooks
        self.cache = torch.full((batch_size, K, self.ct), UNGENERATED, device=self.device, dtype=torch.long)
        self.provided = torch.zeros((batch_size, K, self.ct), device=self.device, dtype=torch.bool)
        self.kv = TemporalKV.allocate(c, batch_size, self.device, self.dtype)
        self.dep_keys, self.dep_values = lm.allocate_depformer_kv(batch_size, self.device, self.dtype)
        self.write_lag = 0 if c.personaplex else 1
        self.reset(torch.ones(batch_size, dtype=torch.bool, device=self.device))

    # ---- state -------------------------------------------------------------------------------------

    @property
    def lengths(self) -> torch.Tensor:
        """[B] model passes per row since its reset (= the position of the next pass)."""
        return self.kv.lengths

    def reset(self, mask: torch.Tensor) -> None:
        """Reset the rows in ``mask`` [B] bool to a fresh session, leaving the others untouched.

        This includes the reference's hidden first call: column 0 holds the initial tokens, all provided.
        """
        m = mask.view(-1, 1, 1)
        fresh_cache = torch.full_like(self.cache, UNGENERATED)
        fresh_cache[:, :, 0] = self.initial
        fresh_provided = torch.zeros_like(self.provided)
        fresh_provided[:, :, 0] = True
        self.cache.copy_(torch.where(m, fresh_cache, self.cache))
        self.provided.copy_(torch.where(m, fresh_provided, self.provided))
        self.kv.reset(mask)

    def restore_token_cache(self, row: int, cache: torch.Tensor) -> None:
        """Overwrite row ``row``'s token ring with a voice prompt's saved ring [K, CT] (flags are kept)."""
        if tuple(cache.shape) != (self.config.num_codebooks, self.ct):
            raise ValueError(
                f"voice prompt cache has shape {tuple(cache.shape)}, expected {(self.config.num_codebooks, self.ct)}"
            )
        self.cache[row].copy_(cache.to(self.cache))

    # ---- one step ----------------------------------------------------------------------------------

    @torch.no_grad()
    def step(
        self,
        forced: torch.Tensor,
        forced_mask: torch.Tensor,
        exec_mask: torch.Tensor,
        embeddings: torch.Tensor | None = None,
        use_embeddings: torch.Tensor | None = None,
    ) -> StepOutput:
        """Advance every executing row by one model pass.

        Args:
            forced: [B, K] tokens to force for this call (user codes live; text/agent/user in a prefill).
            forced_mask: [B, K] bool, which entries of ``forced`` apply.
            exec_mask: [B] bool; other rows are left exactly as they were.
            embeddings: optional [B, 1, dim] input embeddings replacing the token embeddings (voice replay).
            use_embeddings: [B] bool, rows that take ``embeddings``.
        """
        c = self.config
        B, K, CT = self.batch_size, c.num_codebooks, self.ct
        ex = exec_mask.view(B, 1)
        o = self.kv.lengths + 1  # [B] the reference's offset
        w = o - self.write_lag
        # 1. forced tokens at w + delay, then the initial-token rule on column w.
        cols = ((w.view(B, 1) + self.delays.view(1, K)) % CT).unsqueeze(-1)  # [B, K, 1]
        do_force = (forced_mask & ex).unsqueeze(-1)
        self._masked_put(cols, forced.unsqueeze(-1), do_force)
        is_init = ((w.view(B, 1) <= self.delays.view(1, K)) & ex).unsqueeze(-1)
        wcol = (w % CT).view(B, 1, 1).expand(B, K, 1)
        self._masked_put(wcol, self.initial.view(1, K, 1).expand(B, K, 1), is_init)
        # 2. model pass on column o - 1.
        read_col = ((o - 1) % CT).view(B, 1, 1).expand(B, K, 1)
        target_col = (o % CT).view(B, 1, 1).expand(B, K, 1)
        column = self.cache.gather(2, read_col)[:, :, 0]  # [B, K]
        x = self.lm.embed_codes(column)
        if embeddings is not None and use_embeddings is not None:
            x = torch.where(use_embeddings.view(B, 1, 1), embeddings.to(x), x)
        hidden, text_logits = self.lm.forward_embeddings(x, self.kv, exec_mask)
        s = self.sampling
        sampled_text = sample_token(text_logits.float(), s.use_sampling, s.temp_text, s.top_k_text, self.generator)
        target = self.cache.gather(2, target_col)[:, :, 0]  # [B, K]
        target_provided = self.provided.gather(2, target_col)[:, :, 0]
        text_in = torch.where(target_provided[:, 0], target[:, 0], sampled_text)
        audio = self._depformer(hidden, text_in, target[:, 1:], target_provided[:, 1:])  # [B, dep_q]
        # 3. write back: clear flags of the column just read, fill column o where not provided.
        clear = ex.view(B, 1, 1).expand(B, K, 1)
        self.provided.scatter_(2, read_col, torch.where(clear, False, self.provided.gather(2, read_col)))
        new = torch.cat([sampled_text[:, None], audio], dim=1)  # [B, 1 + dep_q]
        G = 1 + c.dep_q
        gen_target = target_col[:, :G]
        fill = (~target_provided[:, :G] & ex).unsqueeze(-1)
        self._masked_put(gen_target, new.unsqueeze(-1), fill, rows=G)
        # 4. the de-delayed frame o - 1 (rows with delay d come from column o - max_delay + d).
        out_cols = ((o.view(B, 1) - c.max_delay + self.delays[:G].view(1, G)) % CT).unsqueeze(-1)
        tokens = self.cache[:, :G].gather(2, out_cols)[:, :, 0]
        valid = exec_mask & (o > c.max_delay)
        tokens = torch.where(valid.view(B, 1), tokens, torch.full_like(tokens, UNGENERATED))
        return StepOutput(tokens=tokens, valid=valid, text_logits=text_logits)

    def _masked_put(self, cols: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, rows: int | None = None):
        """cache[:, :rows].scatter at ``cols`` [B, R, 1] where ``mask``; marks provided only for forced writes."""
        cache = self.cache if rows is None else self.cache[:, :rows]
        old = cache.gather(2, cols)
        cache.scatter_(2, cols, torch.where(mask, values, old))
        if rows is None:  # forced / initial writes are provided; generated writes are not
            prov = self.provided.gather(2, cols)
            self.provided.scatter_(2, cols, prov | mask)

    def _depformer(self, hidden, text_token, forced_audio, forced_audio_mask) -> torch.Tensor:
        """dep_q sequential codebooks; the next step's input is the provided token where there is one."""
        s = self.sampling
        prev = text_token
        out = []
        for k in range(self.config.dep_q):
            logits = self.lm.depformer_logits(k, prev, hidden, self.dep_keys, self.dep_values)
            token = sample_token(logits.float(), s.use_sampling, s.temp, s.top_k, self.generator)
            out.append(token)
            prev = torch.where(forced_audio_mask[:, k], forced_audio[:, k], token)
        return torch.stack(out, dim=1)
