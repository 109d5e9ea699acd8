"""Unit engine (MiniCPM-o 4.5 duplex) on one GPU at the real 4.5 shapes: eager runner vs fast runner.

The model is built directly on the GPU with random weights at the published 4.5 shapes (Qwen3-8B LLM,
Whisper-medium encoder, SigLIP-400M vision, 0.35 B TTS) in bf16; both runners share it. A random LLM rarely
speaks the way a real one does, so the bench makes units speak or listen on purpose: a "listen" unit is
sent with force_listen, a "speak" unit decides freely with the LLM's listen / end-of-chunk / end-of-turn
rows zeroed (so it keeps talking until the 28-character unit cap or 19 ids: the expensive case). Times are
the unit work without the vocoder: prefill (mel, audio encoder, frame, LLM), decisions, TTS codes, with the
device synchronised.

Reports: listen / speak / omni unit median and p99 for one session (eager and fast); sessions served
within the 1 s budget by the fast runner with ~40% of units speaking (p99 of the whole tick over >= 60
ticks); device memory per session; greedy equality (bf16, 30 units: eager vs fast alone, and vs the same
session ticked with three others); a torch.profiler
summary of one 16-session tick; the native Token2Wav per 1 s unit (the unit's vocoder stage, timed on its
own: random assets at the published flow / HiFT shapes and tiny ones, 5 and 10 flow steps); apart
(``--vocoder-batched``), Token2Wav for N speaking sessions session by session vs batched.

Usage (GPU machine)::

    python3 bench/unit_gpu.py --out $OUT                  # $OUT/unit-<gpu>-<commit>.json (BENCH_COMMIT=...)
    python3 bench/unit_gpu.py --vocoder-only --out $OUT   # token2wav-<gpu>-<commit>.json
    python3 bench/unit_gpu.py --vocoder-batched --published-sizes --vocoder-units 50 --out $OUT
        # unit-vocoder-batched-<gpu>-<commit>.json: N speaking sessions, session by session vs batched
    python3 bench/unit_gpu.py --checkpoint /tmp/ref-ckpt ...   # the reference's weights (unit_reference.py)
    python3 bench/unit_gpu.py --reference-src .ref/minicpmo-demo --reference-site /tmp/ref-site ...
        # the side by side in one run: the reference first (its own process), then ours on its weights, ratios
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_io import result_path, write_result  # noqa: E402
from bench.stats import summary  # noqa: E402
from bench.unit_equality import greedy_equality  # noqa: E402
from bench.unit_sessions import one_session, tick  # noqa: E402
from bench.unit_side_by_side import reference_side, run_reference  # noqa: E402
from bench.unit_vocoder import batched_section, vocoder_section  # noqa: E402
from bench.unit_workload import DATA, REAL_45, make_audio, sync  # noqa: E402
from inference.models.minicpmo.audio_encoder import MelFrontEnd  # noqa: E402
from inference.models.minicpmo.config import MiniCPMOConfig  # noqa: E402
from inference.models.minicpmo.duplex import DuplexRunner  # noqa: E402
from inference.models.minicpmo.fast.runner import FastDuplexRunner  # noqa: E402
from inference.models.minicpmo.invariant.modules import use_row_invariant_kernels  # noqa: E402
from inference.models.minicpmo.loading import build_parts, load_model, load_tokenizer  # noqa: E402

BUDGET_MS = 1000.0


def build_model(dtype: torch.dtype, config: dict, device: str):
    cfg = MiniCPMOConfig.from_dict(config)
    tokenizer, bad = load_tokenizer(DATA / "tokenizer")
    torch.manual_seed(0)
    with torch.device(device):
        parts = build_parts(cfg, tokenizer, bad)
    parts.audio.front_end = MelFrontEnd(cfg.audio.num_mel_bins)  # the mel runs on the host, as when loaded
    with torch.no_grad():  # zero-initialised parameters (the resampler's) would time a faster, unreal model
        for _, module in parts.modules().values():
            for param in module.parameters():
                if not param.any():
                    param.normal_(0.0, 0.02)
    for _, module in parts.modules().values():
        module.to(dtype=dtype).eval()
    parts.tts.bake()
    parts.device, parts.dtype = torch.device(device), dtype
    if device == "cuda":  # as load_model does on CUDA: the eager path on the fast path's reductions
        use_row_invariant_kernels(parts)
    keep_speaking(parts)
    return parts


def keep_speaking(parts) -> None:
    """A speaking unit keeps speaking (see the module docstring): the listen / end rows of lm_head are zeroed."""
    runner = DuplexRunner(parts)
    with torch.no_grad():
        w = parts.llm.llm.lm_head.weight
        for tok in (runner.ids.listen, runner.ids.chunk_eos, runner.ids.chunk_tts_eos, runner.ids.turn_eos):
            w[tok].zero_()


def stats(values: list[float]) -> dict:
    return summary(values, suffix="_ms", digits=1, median=True)


def step_costs(runner, reps: int = 200) -> dict:
    """One decode step of the LLM and of the TTS as the runner launches it (one row, on the scratch slot), ``reps``
    back to back: ``free`` with nothing read between steps (the device's time per step), ``read`` with each step's
    argmax read by the host before the next (the host's turnaround added). A unit's steps fall between the two."""
    out = {}
    for name, graphs in (("llm", runner.fast_llm.graphs), ("tts", runner.fast_tts.graphs)):
        scratch = graphs.pool.scratch
        for kv_len in (1024, 2048):
            for mode in ("free", "read"):
                graphs.step([scratch], [0], [kv_len - 1])  # captured before the clock starts
                sync()
                t0 = time.perf_counter()
                for _ in range(reps):
                    _, logits = graphs.step([scratch], [0], [kv_len - 1])
                    if mode == "read":
                        int(logits[0].argmax())
                sync()
                out[f"{name}_kv{kv_len}_{mode}_ms"] = round((time.perf_counter() - t0) * 1000 / reps, 3)
    return out


def per_kind(runs: list[dict]) -> dict:
    """Median / p99 per unit kind over every unit of ``runs`` (one or more ``one_session`` results)."""
    out = {"prepare_ms": stats([r["prepare_ms"] for r in runs])}
    for kind in ("listen", "speak", "omni_listen", "omni_speak"):
        rows = [u for r in runs for u in r["units"] if u["kind"] == kind]
        out[kind] = stats([u["unit_ms"] for u in rows])
        out[kind]["prefill"] = stats([u["prefill_ms"] for u in rows])
        out[kind]["mel_host"] = stats([u["mel_ms"] for u in rows])
        out[kind]["generate"] = stats([u["generate_ms"] for u in rows])
        out[kind]["generate_tts"] = stats([u["tts_ms"] for u in rows])
        out[kind]["generate_llm"] = stats([u["generate_ms"] - u["tts_ms"] for u in rows])  # the decisions' steps
        out[kind]["n_ids"] = summary([u["n_ids"] for u in rows], median=True)
    return out


def capacity(runner, n: int, ticks: int) -> dict:
    sessions = [runner.new_session() for _ in range(n)]
    audios = [make_audio(ticks, 100 + i) for i in range(n)]
    for i, s in enumerate(sessions):
        runner.prepare(s, "Streaming Omni Conversation.", make_audio(2, 200 + i))
    tick_ms, speaking = [], []
    for u in range(ticks):
        sync()
        t0 = time.perf_counter()
        results = tick(runner, sessions, audios, None, u, list(range(n)))
        sync()
        if u >= 3:  # the first three units are forced listens for every session
            tick_ms.append((time.perf_counter() - t0) * 1000)
            speaking.append(sum(not r.is_listen for r in results) / n)
    kv = max(runner.parts.llm.cache_length(s.llm_cache) for s in sessions)
    del sessions
    row = {"sessions": n, "ticks": stats(tick_ms), "speaking_fraction": round(float(np.mean(speaking)), 3)}
    row["max_kv_len"] = kv
    return row


def profile_tick(runner, n: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    sessions = [runner.new_session() for _ in range(n)]
    audios = [make_audio(8, 300 + i) for i in range(n)]
    for i, s in enumerate(sessions):
        runner.prepare(s, "Streaming Omni Conversation.", make_audio(2, 400 + i))
    for u in range(7):
        tick(runner, sessions, audios, None, u, list(range(n)))
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        tick(runner, sessions, audios, None, 7, [1] * n)  # every session speaks this tick
        sync()
    del sessions
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)


def single_session_and_equality(result: dict, eager, fast, reference, args, device: str) -> None:
    """Step costs, one session's units (eager and fast), the ratios to the reference, greedy equality."""
    if device == "cuda":
        result["step_costs"] = step_costs(fast)
        print("step costs", json.dumps(result["step_costs"]), flush=True)
    for name, runner, (audio_u, omni_u), repeat in (
        ("eager", eager, (12, 6), 1),
        ("fast", fast, (40, 20), args.repeat),
    ):
        one_session(runner, 6, 2, seed=7)  # first-seen shapes and lazy graphs (the reference's second session)
        runs = [one_session(runner, audio_u, omni_u, seed=11 + k) for k in range(repeat)]
        summary_ = {"sessions": repeat, "units_per_session": [audio_u, omni_u], **per_kind(runs)}
        result[f"one_session_{name}"] = summary_
        print(name, json.dumps(summary_), flush=True)
        if name == "fast":  # every unit kept: the tail's evidence (which units, how long, where in the call)
            result["one_session_fast_units"] = [
                {k: v for k, v in u.items() if k != "ids"} | {"session": i}
                for i, r in enumerate(runs)
                for u in r["units"]
            ]
    if reference is not None:
        result["reference"] = reference_side(reference, result["one_session_fast"])
        print("ratios (fast / reference)", json.dumps(result["reference"]["ratios"]), flush=True)
    result["greedy_equality_bf16"] = greedy_equality(eager, fast)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", default=None, help="a file, or a directory for the named result (default: bench/results/)"
    )
    parser.add_argument("--sessions", default="8,16,24,32")
    parser.add_argument("--ticks", type=int, default=64)
    parser.add_argument("--tiny", action="store_true", help="the golden pack's tiny config on this device (smoke)")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="a published-layout checkpoint (e.g. unit_reference.py --save-checkpoint): its weights, not random ones",
    )
    parser.add_argument("--repeat", type=int, default=1, help="measured fast sessions (40 audio + 20 omni units each)")
    parser.add_argument(
        "--reference-src",
        type=Path,
        help="run the reference first, in this process's run (folder holding MiniCPMO45/, unit-reference-src.sh): "
        "it builds the random weights, saves them to --reference-checkpoint, and ours loads them",
    )
    parser.add_argument("--reference-site", type=Path, help="the reference's wheels, installed with pip --target")
    parser.add_argument("--reference-python", default=sys.executable, help="the interpreter that runs the reference")
    parser.add_argument("--reference-units", default="60,20", help="audio,omni units of the reference's measurement")
    parser.add_argument("--reference-checkpoint", type=Path, default=Path("/dev/shm/parley-unit-ref-ckpt"))
    parser.add_argument(
        "--deadline-s", type=float, default=480, help="skip capacity rows after the first one past this"
    )
    parser.add_argument("--vocoder-units", type=int, default=300, help="units per Token2Wav row (0: none)")
    parser.add_argument("--vocoder-only", action="store_true", help="only the Token2Wav section (its own results)")
    parser.add_argument(
        "--vocoder-batched",
        action="store_true",
        help="only Token2Wav for N speaking sessions, session by session vs batched (its own results; "
        "--vocoder-units units per N)",
    )
    parser.add_argument("--batched-sizes", default="1,4,8,16,32", help="speaking sessions per --vocoder-batched row")
    parser.add_argument(
        "--published-sizes", action="store_true", help="--vocoder-batched on the published flow/HiFT shapes, not tiny"
    )
    parser.add_argument("--equality-only", action="store_true", help="only the greedy equality section")
    parser.add_argument(
        "--capacity-only",
        action="store_true",
        help="only the sessions-per-GPU rows (graphs captured to 2048 positions)",
    )
    args = parser.parse_args()
    t_start = time.perf_counter()
    torch.set_grad_enabled(False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.set_num_threads(1)  # as the unit engine serves on CUDA (inference/engines/unit.py)
    if args.vocoder_batched:
        sizes = [int(n) for n in args.batched_sizes.split(",")]
        result = {
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "token2wav_batched": batched_section(sizes, args.vocoder_units, args.published_sizes, device),
        }
        result["wall_s"] = round(time.perf_counter() - t_start, 1)
        print(f"wrote {write_result(result, 'unit-vocoder-batched', gpu=device == 'cuda', out=args.out)}")
        return 0
    if args.vocoder_only:
        result = {
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "torch": torch.__version__,
            "token2wav": vocoder_section(args.vocoder_units, device),
        }
        result["wall_s"] = round(time.perf_counter() - t_start, 1)
        print(f"wrote {write_result(result, 'token2wav', gpu=True, out=args.out)}")
        return 0
    sizes = [int(s) for s in args.sessions.split(",")]
    reference = None
    # What this run measures names its file: the side by side, one section alone, or the fast path's full set.
    what = "unit-side-by-side" if args.reference_src else "unit"
    what = "unit-equality" if args.equality_only else "unit-capacity" if args.capacity_only else what
    if args.reference_src:
        reference = run_reference(args, result_path(what, gpu=True, out=args.out).with_suffix(".reference.json"))
        args.checkpoint = args.reference_checkpoint
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if args.checkpoint:  # the same weights the reference ran (the speaking rule applied to them as well)
        parts = load_model(args.checkpoint, device=device, dtype=dtype)
        keep_speaking(parts)
        weights = f"checkpoint {args.checkpoint}"
    else:
        config = json.loads((DATA / "config.json").read_text()) if args.tiny else REAL_45
        parts = build_model(dtype, config, device)
        weights = f"random MiniCPM-o 4.5 at {'the tiny golden-pack' if args.tiny else 'the real'} shapes"
    params = sum(p.numel() for _, m in parts.modules().values() for p in m.parameters())
    print(f"model built: {params / 1e9:.3f} B parameters, {time.perf_counter() - t_start:.0f} s", flush=True)
    eager = DuplexRunner(parts)
    mem0 = torch.cuda.memory_allocated() if device == "cuda" else 0
    fast = FastDuplexRunner(parts, num_slots=max(sizes) + 1)
    pools = (torch.cuda.memory_allocated() - mem0) if device == "cuda" else 0
    t0 = time.perf_counter()
    graphs = fast.capture(max_kv=2048 if args.capacity_only else 4096)
    capture_s = time.perf_counter() - t0
    print(f"captured {graphs} graphs in {capture_s:.1f} s", flush=True)
    result: dict = {
        "bench": "unit_gpu",
        "model": f"{weights} ({params / 1e9:.3f} B parameters), {parts.dtype} on {device}",
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "torch": torch.__version__,
        "speaking_rule": "listen units are sent with force_listen; speak units decide freely with the listen, "
        "chunk_eos, chunk_tts_eos and turn_eos rows of lm_head zeroed (speaks to the 28-char cap or 19 ids)",
        "reference": "not run in this run (--reference-src)",
        "graphs_captured": graphs,
        "graph_capture_s": round(capture_s, 1),
        "memory": {
            "parameters_gb": round(params * 2 / 1e9, 2),
            "session_pool_bytes": fast.session_bytes(),
            "session_pool_gb": round(fast.session_bytes() / 1e9, 3),
            "pools_allocated_gb": round(pools / 1e9, 2),
        },
    }
    if args.equality_only:
        result["greedy_equality_bf16"] = greedy_equality(eager, fast)
        sizes = []
    elif not args.capacity_only:
        single_session_and_equality(result, eager, fast, reference, args, device)
    rows = []
    for n in sizes:
        # the first size is the goal's row (16 sessions): it always runs; the deadline only drops the larger ones
        if n != sizes[0] and time.perf_counter() - t_start > args.deadline_s:
            rows.append({"sessions": n, "skipped": "bench deadline"})
            continue
        row = capacity(fast, n, args.ticks)
        rows.append(row)
        print("capacity", json.dumps(row), flush=True)
    fits = [r["sessions"] for r in rows if "ticks" in r and r["ticks"]["p99_ms"] <= BUDGET_MS]
    result["capacity_fast"] = {"budget_ms": BUDGET_MS, "max_sessions_within_budget": max(fits, default=0), "rows": rows}
    try:
        if not (args.capacity_only or args.equality_only):
            result["profile_16_all_speaking"] = profile_tick(fast, min(16, max(sizes))).splitlines()
    except RuntimeError as exc:  # the profiler is optional evidence; the numbers above stand without it
        result["profile_16_all_speaking"] = f"profiler failed: {exc}"
    if args.vocoder_units > 0:  # the unit's last stage, beside the rest (0: left out, measured on its own)
        result["token2wav"] = vocoder_section(args.vocoder_units, device)
    result["peak_allocated_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2) if device == "cuda" else None
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    out = write_result(result, what, gpu=True, out=args.out)
    profile = result.get("profile_16_all_speaking")
    print("\n".join(profile) if isinstance(profile, list) else profile or "")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
