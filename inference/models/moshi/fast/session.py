"""Driving slots of a ``FastLockstep`` through a PersonaPlex session: prefill frames, then live user codes.

The engine interleaves a joining slot's prefill with live ticks (``prefill_steps_within``); this module also
gives tests and the benchmark one way to replay whole sessions on several slots at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from inference.models.moshi.personaplex import PrefillFrame

StepFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def run_prefill(step: StepFn, lockstep, slots: Sequence[int], frames: Sequence[PrefillFrame]) -> None:
    """Feed the same prefill ``frames`` to every slot in ``slots`` (one pass per frame, all slots batched).

    ``step`` is ``FastLockstep.step_eager`` or ``GraphedLockstep.step``; ``restore_cache_after`` is applied
    between passes, on the host side, as the reference does after the voice replay.
    """
    device = lockstep.device
    n = len(slots)
    slot_ids = torch.tensor(list(slots), device=device, dtype=torch.long)
    dim = lockstep.config.dim
    for frame in frames:
        forced = frame.forced.to(device).view(1, -1).expand(n, -1)
        mask = frame.forced_mask.to(device).view(1, -1).expand(n, -1)
        if frame.embedding is not None:
            emb = frame.embedding.to(device=device, dtype=lockstep.lm.dtype).reshape(1, dim).expand(n, -1)
            use = torch.ones(n, device=device, dtype=torch.bool)
            step(slot_ids, forced, mask, emb, use)
        else:
            step(slot_ids, forced, mask)
        if frame.restore_cache_after is not None:
            for slot in slots:
                lockstep.restore_token_cache(slot, frame.restore_cache_after)


def live_forced(config, user_codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """User codes [R, 8] of one tick -> (forced [R, K], mask [R, K]) forcing only the user rows."""
    R = user_codes.shape[0]
    K = config.num_codebooks
    forced = torch.zeros((R, K), device=user_codes.device, dtype=torch.long)
    forced[:, 1 + config.n_q // 2 :] = user_codes
    mask = torch.zeros((R, K), device=user_codes.device, dtype=torch.bool)
    mask[:, 1 + config.n_q // 2 :] = True
    return forced, mask


def prefill_steps_within(budget_ms: float, live_tick_ms: float, prefill_step_ms: float, pending: int) -> int:
    """How many prefill passes fit into one tick after the live step without missing the 80 ms deadline.

    Args:
        budget_ms: the tick deadline minus a safety margin (codec time included by the caller).
        live_tick_ms: measured cost of this tick's live step (p99 is the safe choice).
        prefill_step_ms: measured cost of one prefill pass at the prefill bucket.
        pending: prefill passes still to run.
    """
    if prefill_step_ms <= 0:
        raise ValueError("prefill_step_ms must be positive")
    spare = budget_ms - live_tick_ms
    return max(0, min(pending, int(spare // prefill_step_ms)))
