"""What the KV format does to the outputs: fp8 (e4m3, one fp32 scale per vector) against the model's dtype.

Same weights, greedy decoding, S sessions with different inputs, F frames, three runs of the fast path:

1. ``base``: KV in the model's dtype (bf16 at the 7B shapes, fp32 on the tiny golden checkpoint), free-running;
2. ``fp8_free``: fp8 KV, free-running: the first frame where a session's tokens differ from ``base``, and how many
   tokens agree (after a divergence the two sessions have different histories, so agreement drifts to chance);
3. ``fp8_forced``: fp8 KV teacher-forced on ``base``'s tokens (every text and agent token ``base`` wrote is
   forced into the same column), so each frame's text logits are computed from the *same* history: the text
   logit KL(base || fp8) per frame and the text argmax agreement isolate the KV format's own error, with no
   compounding.

Works on any device: on CPU the torch twins of the kernels run (the fp8 quantisation included).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from inference.models.moshi.fast.graphs import GraphedLockstep
from inference.models.moshi.fast.model import FastLM
from inference.models.moshi.fast.session import live_forced
from inference.models.moshi.fast.step import FastLockstep
from inference.models.moshi.gen import SamplingConfig

GREEDY = SamplingConfig(use_sampling=False)
Prepare = Callable[[FastLockstep, Callable], None]  # runs a prefill on every slot before the live frames


def _run(fl: FastLM, user_codes: torch.Tensor, kv_fp8: bool, prepare: Prepare | None, teacher: torch.Tensor | None):
    """One run over ``user_codes`` [S, F, 8]. Returns (tokens [S, F, G], valid [S, F], text log-probs
    [F, S, V] on the device, written columns [S, F, K], seconds).

    With ``teacher`` (the written columns of another run), every text / agent token that run wrote is forced.
    """
    c = fl.config
    S, F, _ = user_codes.shape
    K, G = c.num_codebooks, 1 + c.dep_q
    agent = 1 + c.n_q // 2  # text + agent codebooks: the columns the model writes
    ls = FastLockstep(fl, num_slots=S, max_rows=S, sampling=GREEDY, kv_fp8=kv_fp8, keep_text_logits=True)
    gl = GraphedLockstep(ls, buckets=(S,))
    gl.capture()
    slots = torch.arange(S, device=fl.device)
    if prepare is not None:
        prepare(ls, gl.step)
    delays = torch.tensor(c.delays, device=fl.device)
    tokens, valid, logp, written = [], [], [], []
    started = time.perf_counter()
    for f in range(F):
        forced, mask = live_forced(c, user_codes[:, f].to(fl.device))
        if teacher is not None:
            # this pass forces column offset + delay, the column the teacher wrote at frame f + delay
            future = f + delays[:agent]
            ok = future < F
            idx = future.clamp(max=F - 1)
            cols = teacher[:, idx, torch.arange(agent, device=fl.device)]  # [S, agent]
            forced[:, :agent] = torch.where(ok.view(1, -1), cols, forced[:, :agent])
            mask[:, :agent] = ok.view(1, -1).expand(S, -1)
        t, v = gl.step(slots, forced, mask)
        tokens.append(t.clone())
        valid.append(v.clone())
        assert ls.text_logits is not None
        logp.append(torch.log_softmax(ls.text_logits[:S].float(), dim=-1).clone())
        col = (ls.lengths[slots] % ls.ct).view(S, 1, 1).expand(S, K, 1)
        written.append(ls.cache[slots].gather(2, col)[:, :, 0].clone())  # [S, K]: the column this pass wrote
    if fl.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    out = (
        torch.stack(tokens, 1)[:, :, :G],
        torch.stack(valid, 1),
        torch.stack(logp, 0),
        torch.stack(written, 1),
        seconds,
    )
    del gl, ls
    return out


def compare_kv_formats(
    fl: FastLM,
    sessions: int = 8,
    frames: int = 500,
    seed: int = 0,
    prepare: Prepare | None = None,
    first_codes: torch.Tensor | None = None,
    golden: np.ndarray | None = None,
) -> dict:
    """Run ``base`` / ``fp8_free`` / ``fp8_forced`` (module docstring) and summarise the differences.

    Args:
        first_codes: session 0's user codes [frames', 8] (e.g. a golden session's), the rest stay random.
        golden: the reference's tokens of session 0 [frames, G]: reported against both runs' session 0.
    """
    g = torch.Generator().manual_seed(seed)
    user_codes = torch.randint(0, fl.config.card, (sessions, frames, 8), generator=g)
    if first_codes is not None:
        user_codes[0, : len(first_codes)] = first_codes[:frames]
    base_tok, base_valid, base_logp, base_written, base_s = _run(fl, user_codes, False, prepare, None)
    free_tok, _, free_logp, _, free_s = _run(fl, user_codes, True, prepare, None)
    _, _, forced_logp, _, forced_s = _run(fl, user_codes, True, prepare, base_written)

    ok = base_valid.cpu().numpy()  # [S, F]
    bt, ft = base_tok.cpu().numpy(), free_tok.cpu().numpy()
    same_frame = (bt == ft).all(axis=2) | ~ok  # a frame before the delay warm-up is equal by definition
    first_div = []
    for s in range(sessions):
        bad = np.flatnonzero(~same_frame[s])
        first_div.append(int(bad[0]) if bad.size else None)
    agree = (bt == ft)[ok]  # [n_valid, G]

    def kl(p_log: torch.Tensor, q_log: torch.Tensor) -> np.ndarray:  # [F, S] KL(p || q) in nats
        return (p_log.exp() * (p_log - q_log)).sum(-1).cpu().numpy()

    kl_forced = kl(base_logp, forced_logp)
    kl_free = kl(base_logp, free_logp)
    argmax_forced = (base_logp.argmax(-1) == forced_logp.argmax(-1)).float().cpu().numpy()  # [F, S]
    per_frame = kl_forced.mean(axis=1)
    against_golden = {}
    if golden is not None:
        n = min(len(golden), frames)
        for name, toks in (("base", bt), ("fp8_free", ft)):
            diff = np.flatnonzero((toks[0, :n] != golden[:n]).any(axis=1))
            against_golden[name] = {
                "frames": n,
                "equal": diff.size == 0,
                "first_divergence_frame": int(diff[0]) if diff.size else None,
                "token_agreement": round(float((toks[0, :n] == golden[:n]).mean()), 4),
            }
    return {
        "session0_against_golden": against_golden or None,
        "sessions": sessions,
        "frames": frames,
        "base_kv": str(fl.dtype).replace("torch.", ""),
        "first_divergence_frame": first_div,
        "sessions_never_diverged": sum(d is None for d in first_div),
        "free_running_token_agreement": round(float(agree.mean()), 4) if agree.size else None,
        "free_running_text_agreement": round(float(agree[:, 0].mean()), 4) if agree.size else None,
        "teacher_forced_text_argmax_agreement": round(float(argmax_forced.mean()), 5),
        "teacher_forced_text_kl_nats": _summary(kl_forced.ravel()),
        "teacher_forced_text_kl_per_frame_mean": [round(float(x), 6) for x in per_frame],
        "free_running_text_kl_nats": _summary(kl_free.ravel()),
        "seconds": {"base": round(base_s, 1), "fp8_free": round(free_s, 1), "fp8_forced": round(forced_s, 1)},
    }


def _summary(x: np.ndarray) -> dict:
    return {
        "mean": round(float(x.mean()), 6),
        "median": round(float(np.median(x)), 6),
        "p99": round(float(np.percentile(x, 99)), 6),
        "max": round(float(x.max()), 6),
    }


def forced_against(
    fl_base: FastLM, others: dict[str, tuple[FastLM, bool]], user_codes: torch.Tensor, prepare: Prepare | None = None
) -> dict:
    """Text-logit KL of other numerics against ``fl_base`` (its own KV dtype), each teacher-forced on its tokens.

    ``others`` maps a name to (model, fp8 KV?): e.g. the same weights in bf16 with bf16 or fp8 KV, which puts the
    KV format's error next to the error of the serving dtype itself.
    """
    _, _, base_logp, base_written, _ = _run(fl_base, user_codes, False, prepare, None)
    out = {}
    for name, (fl, fp8) in others.items():
        _, _, logp, _, _ = _run(fl, user_codes, fp8, prepare, base_written)
        kl = (base_logp.exp() * (base_logp - logp.float())).sum(-1).cpu().numpy()
        argmax = (base_logp.argmax(-1) == logp.argmax(-1)).float().mean().item()
        out[name] = {"text_kl_nats": _summary(kl.ravel()), "text_argmax_agreement": round(argmax, 5)}
    return out
