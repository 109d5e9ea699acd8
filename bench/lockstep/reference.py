"""The reference, moshi 0.2.13, on the GPU: built with random bf16 weights, timed, and its capacity measured.

Its ``LMGen`` runs with its defaults (torch.compile + CUDA graphs). ``native_from_reference`` hands the very same
tensors to Parley's ``MoshiLM`` so that both paths are timed on identical weights.
"""

from __future__ import annotations

import time

import torch

from bench.lockstep.common import GiB, free_memory, log, stats
from inference.models.moshi.config import LMConfig
from inference.models.moshi.lm import MoshiLM
from inference.models.moshi.loading import load_lm_state


def build_reference(dep_q: int):
    from moshi.models import loaders

    kwargs = dict(loaders._lm_kwargs, dep_q=dep_q)
    return loaders.get_moshi_lm(None, lm_kwargs=kwargs, device="cuda", dtype=torch.bfloat16).eval()


def time_reference(lm_ref, batch_sizes: list[int], warmup: int, ticks: int) -> dict:
    from moshi.models.lm import LMGen

    out = {}
    for B in batch_sizes:
        free_memory()
        torch.cuda.reset_peak_memory_stats()
        gen = LMGen(lm_ref)  # moshi defaults: sampling, torch.compile + CUDA graphs
        codes = torch.randint(0, 2048, (B, 8, 1), device="cuda")
        try:
            with gen.streaming(B):
                t0 = time.perf_counter()
                for _ in range(warmup):
                    gen.step(codes)
                torch.cuda.synchronize()
                warm_s = time.perf_counter() - t0
                times = []
                for _ in range(ticks):
                    t = time.perf_counter()
                    tok = gen.step(codes)
                    if tok is not None:
                        tok.cpu()
                    torch.cuda.synchronize()
                    times.append((time.perf_counter() - t) * 1e3)
            out[B] = stats(times) | {
                "peak_GiB": round(torch.cuda.max_memory_allocated() / GiB, 2),
                "warmup_s": round(warm_s, 1),
            }
            log(f"  ref B={B}: {out[B]}")
        except torch.OutOfMemoryError:
            out[B] = {"oom": True}
            log(f"  ref B={B}: out of memory")
        del gen
        free_memory()
    return out


def reference_state_to_fused(sd: dict) -> dict:
    """moshi's internal names (``in_projs.{i}``/``out_projs.{i}``) -> the published fused names."""
    fused, groups = {}, {}
    for key, value in sd.items():
        for part in ("in_projs", "out_projs"):
            marker = f".self_attn.{part}."
            if marker in key:
                prefix, rest = key.split(marker)
                index = int(rest.split(".")[0])
                name = "in_proj_weight" if part == "in_projs" else "out_proj.weight"
                groups.setdefault(f"{prefix}.self_attn.{name}", {})[index] = value
                break
        else:
            fused[key] = value
    for key, parts in groups.items():
        tensors = [parts[i] for i in sorted(parts)]
        fused[key] = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
    return fused


def native_from_reference(lm_ref, dep_q: int) -> MoshiLM:
    """Parley's MoshiLM holding the reference's tensors (temporal weights aliased, depformer stacks copied)."""
    config = LMConfig(dep_q=dep_q)
    with torch.device("meta"):
        lm = MoshiLM(config)
    load_lm_state(lm, reference_state_to_fused(lm_ref.state_dict()), source="reference", allow_widen=False)
    return lm.eval().requires_grad_(False)


def reference_capacity(lm_ref, start: int, step: int, limit: int, ticks: int = 3) -> dict:
    """Run the reference at growing batch sizes (start, start + step, ...) until one fails to allocate.

    Each size is built fresh (``LMGen.streaming(B)`` allocates its bf16 KV for the whole context) and stepped
    ``ticks`` times after its warm-up; the largest size that ran is the measured capacity.
    """
    from moshi.models.lm import LMGen

    tried, largest = {}, 0
    B = start
    while B <= limit:
        free_memory()
        torch.cuda.reset_peak_memory_stats()
        gen = None
        try:
            gen = LMGen(lm_ref)
            codes = torch.randint(0, 2048, (B, 8, 1), device="cuda")
            with gen.streaming(B):
                for _ in range(3 + ticks):
                    gen.step(codes)
                torch.cuda.synchronize()
            tried[B] = {"ran": True, "peak_GiB": round(torch.cuda.max_memory_allocated() / GiB, 2)}
            largest = B
            log(f"  ref capacity B={B}: ran, peak {tried[B]['peak_GiB']} GiB")
        except torch.OutOfMemoryError:
            tried[B] = {"ran": False, "error": "out of memory"}
            log(f"  ref capacity B={B}: out of memory")
            break
        finally:
            del gen
            free_memory()
        B += step
    return {"tried": tried, "largest_that_ran": largest, "stopped_by": "oom" if B <= limit else f"limit {limit}"}
