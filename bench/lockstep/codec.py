"""The batched Mimi codec on the GPU, and whole ticks of the bench's bare loop (encode -> step -> decode)."""

from __future__ import annotations

import time

import torch

from bench.lockstep.common import FRAME_MS, log, stats
from inference.models.moshi.fast.codec import GraphedMimi
from inference.models.moshi.fast.graphs import GraphedLockstep
from inference.models.moshi.fast.session import live_forced


def build_mimi():
    from inference.models.moshi.mimi import MimiCodec, MimiConfig

    return MimiCodec(MimiConfig.kyutai_default()).to("cuda").eval()


def check_graphed_mimi(gm: GraphedMimi, frames: int = 6) -> dict:
    """The graphed codec gives the eager codec's codes and PCM on fresh streams (all slots, random audio)."""
    n = gm.num_slots
    slots = torch.arange(n, device="cuda")
    state = gm.codec.init_stream(n)
    gm.state.reset()
    g = torch.Generator(device="cuda").manual_seed(0)
    worst, codes_equal = 0.0, True
    for _ in range(frames):
        pcm = torch.randn(n, 1, gm.frame, device="cuda", generator=g) * 0.1
        codes_eager = gm.codec.encode_step(pcm, state)[:, :, 0]
        codes_graph = gm.encode(pcm, slots).clone()
        codes_equal &= bool(torch.equal(codes_eager, codes_graph))
        pcm_eager = gm.codec.decode_step(codes_eager.unsqueeze(-1), state, validate=False)
        pcm_graph = gm.decode(codes_eager, slots)
        worst = max(worst, float((pcm_eager - pcm_graph).abs().max()))
    gm.state.reset()
    return {"frames": frames, "codes_equal": codes_equal, "pcm_max_abs_diff": worst}


def time_graphed_mimi(gm: GraphedMimi, batch_sizes: list[int], ticks: int) -> dict:
    out = {}
    for B in batch_sizes:
        slots = torch.arange(B, device="cuda")
        pcm = torch.randn(B, 1, gm.frame, device="cuda") * 0.1
        enc, dec = [], []
        for i in range(ticks + 3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            codes = gm.encode(pcm, slots)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            gm.decode(codes.clamp(0, 2047), slots).cpu()
            t2 = time.perf_counter()
            if i >= 3:
                enc.append((t1 - t) * 1e3)
                dec.append((t2 - t1) * 1e3)
        out[B] = {"encode": stats(enc), "decode_and_copy": stats(dec)}
        log(f"  graphed mimi B={B}: encode {out[B]['encode']['median']} decode {out[B]['decode_and_copy']['median']}")
    gm.state.reset()
    return out


def time_mimi(mimi, batch_sizes: list[int], ticks: int) -> dict:
    out = {}
    for B in batch_sizes:
        state = mimi.init_stream(B)
        pcm = torch.randn(B, 1, 1920, device="cuda") * 0.1
        enc, dec = [], []
        for i in range(ticks + 3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            codes = mimi.encode_step(pcm, state)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            mimi.decode_step(codes, state, validate=False).cpu()
            t2 = time.perf_counter()
            if i >= 3:
                enc.append((t1 - t) * 1e3)
                dec.append((t2 - t1) * 1e3)
        out[B] = {"encode": stats(enc), "decode_and_copy": stats(dec)}
        log(f"  mimi B={B}: encode {out[B]['encode']['median']} decode {out[B]['decode_and_copy']['median']}")
        del state
    return out


def realtime_ticks(
    gl: GraphedLockstep, gm: GraphedMimi, B: int, fill: int, ticks: int, prefill_per_tick: int = 0
) -> dict:
    """Whole ticks: batched Mimi encode -> LM step -> batched Mimi decode -> PCM on the host.

    With ``prefill_per_tick`` > 0, slot B (a joining session) also runs that many prefill passes per tick at
    bucket 1 after the live step, to show a join does not push the live slots past the deadline.
    """
    ls = gl.lockstep
    c = ls.config
    ls.set_passes(range(B), [fill] * B)
    slot_ids = torch.arange(B, device="cuda")
    joiner = torch.tensor([B], device="cuda")
    if prefill_per_tick:
        ls.reset_slot(B)
    pcm = torch.randn(B, 1, gm.frame, device="cuda") * 0.1
    pf_forced = torch.zeros((1, c.num_codebooks), device="cuda", dtype=torch.long) + 3
    pf_mask = torch.ones((1, c.num_codebooks), device="cuda", dtype=torch.bool)
    times = []
    for i in range(ticks + 3):
        t = time.perf_counter()
        codes = gm.encode(pcm, slot_ids)  # [B, 8]
        forced, mask = live_forced(c, codes)
        tok, _ = gl.step(slot_ids, forced, mask, slots=range(B))
        out = gm.decode(tok[:, 1:9].clamp(0, 2047), slot_ids)
        for _ in range(prefill_per_tick):
            gl.step(joiner, pf_forced, pf_mask, slots=[B])
        out.cpu()
        if i >= 3:
            times.append((time.perf_counter() - t) * 1e3)
    s = stats(times)
    s["realtime"] = s["p99"] <= FRAME_MS
    return s
