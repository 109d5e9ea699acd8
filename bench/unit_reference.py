"""The reference MiniCPM-o 4.5 duplex unit loop, timed per stage: the side-by-side for bench/unit_gpu.py (issue 12).

The reference is the ``MiniCPMO45/`` package of OpenBMB/MiniCPM-o-Demo, imported unmodified at run time from the
folder given by ``--src`` (``scripts/unit-reference-src.sh`` exports it from a git mirror into the git-ignored
``.ref/minicpmo-demo/``; nothing of it is committed here). Its model (``modeling_minicpmo_unified.MiniCPMO``) is
built from a config at the real 4.5 shapes (the ``REAL_45`` shapes of bench/unit_workload.py over the other fields of
tests/data/minicpmo45/config.json) or, with ``--tiny``, at that tiny config, with random weights created directly
on the target device, then ``.bfloat16().eval()`` on CUDA as the demo worker loads it (float32 on the CPU), with
``attn_implementation="sdpa"`` (the demo's "auto" without flash-attn). The tokenizer and processor come from the
reference folder's own files (``MiniCPMOProcessor.from_pretrained``, as the package does itself). With
``--checkpoint DIR`` (a published-layout checkpoint, e.g. one Parley's bench loads too) its config.json and
``*.safetensors`` are used instead, so both sides run the same weights; ``--save-checkpoint DIR`` writes the
weights a run used in that layout (config.json, model.safetensors, the reference's tokenizer files).

Driven as the demo worker drives it (core/processors/unified.py ``DuplexView`` -> ``MiniCPMO.duplex_*``), with
``DuplexCapability`` made as ``init_unified`` makes it from the demo's ``DuplexConfig`` defaults (audio on,
explicit listen/speak, 20 ids per unit, force_listen_count 3): ``duplex_prepare`` with the demo's system prompt
around "Streaming Omni Conversation." and 2 s of reference audio, then per unit ``duplex_prefill`` (1 s of audio;
omni units add one 448x448 PIL frame, max_slice_nums 1) -> ``duplex_generate`` (greedy, the demo's other
defaults) -> ``duplex_finalize``. TTS codes come from ``tts.generate_chunk`` inside ``duplex_generate``; the
Token2Wav vocoder is not loaded (its assets come from the hub), so the reference's
``_generate_waveform_from_tokens`` returns at once and no stage includes a vocoder. ``--audio-units`` audio units,
then ``--omni-units`` omni units (default 20 and 10); two sessions back to back, the second is the measurement
(the first, ``--warm-units``, meets the shapes once).

Speaking rule, the same as bench/unit_gpu.py's so the two compare: unit ``u`` speaks when ``u >= 3`` and
``u % 5 in (1, 3)``; the others are sent with ``force_listen_override`` (the demo's per-chunk Force Listen; when
a turn is open the reference first feeds ``<|turn_eos|>``, and that feed is part of its listen unit). The
``<|listen|>``, ``<|chunk_eos|>``, ``<|chunk_tts_eos|>`` and ``<|turn_eos|>`` rows of ``lm_head`` are zeroed so a
speaking unit keeps talking to the 28-character cap or 19 ids, as a random model otherwise would not.

Stages, each timed with the device synchronised before and after: ``prepare``; per unit ``prefill``,
``generate`` (of which ``tts``: every ``generate_chunk`` call, timed by a synchronising wrapper set on the TTS
instance, the reference's code untouched; ``llm`` = generate - tts), ``finalize``, and ``unit`` = prefill +
generate + finalize. Median / p99 / max per stage and per unit kind (listen, speak, omni_listen, omni_speak).

Usage (here, CPU, tiny shapes; the venv holds transformers 4.51 as the reference expects)::

    scripts/unit-reference-src.sh
    .venv-minicpmo-demo/bin/python bench/unit_reference.py --src .ref/minicpmo-demo --tiny \\
        --out /tmp/unit-reference-tiny.json

GPU machine (torch 2.11, transformers 5.17, Python 3.12 on the image): carry ``.whl`` (scripts/gpu-wheels.sh
downloads these too) and ``.ref``; the reference needs, shadowing the image's versions through ``--target``:
transformers==4.51.3, tokenizers==0.21.4 (4.51 pins tokenizers>=0.21,<0.22), huggingface-hub==0.36.2 (4.51 pins
huggingface-hub>=0.30.0,<1.0; the image has 1.x, which 4.51's import-time version check refuses),
accelerate==1.12.0 (the demo's requirements.txt pin; transformers 4.51 imports accelerate when present), and
soundfile==0.14.0 + cffi==2.1.1 + pycparser==3.12 (modeling_minicpmo_unified imports soundfile at module level;
the image has neither soundfile nor cffi). Everything else it imports (numpy, pillow, tqdm, regex, safetensors,
pyyaml, requests, filelock, packaging) is on the image. Then::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ref-site \\
      .whl/ref/*.whl && PYTHONPATH=/tmp/ref-site python3 bench/unit_reference.py --src .ref/minicpmo-demo \\
      --out $OUT   # unit-reference-<gpu>-<commit>.json

(The reference README asks for torch<=2.8; here it ran on torch 2.13 CPU, on the GPU it meets torch 2.11.)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_io import write_result  # noqa: E402  (the standard library only)
from bench.stats import summary  # noqa: E402  (numpy only: importable beside the reference's transformers)
from bench.unit_workload import DATA, REAL_45, make_audio, speaks, sync  # noqa: E402  (numpy and torch only)

KINDS = ("listen", "speak", "omni_listen", "omni_speak")
STAGES = ("prefill", "generate", "llm", "tts", "finalize", "unit")
SYSTEM_PROMPT = "Streaming Omni Conversation."  # the demo DuplexView.prepare default, as bench/unit_gpu.py uses


def merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_checkpoint(model, checkpoint: Path, device: str) -> dict:
    """Parameters from a published-layout checkpoint's ``*.safetensors`` (as ``init_unified(pt_path=)`` loads
    extra weights: ``load_state_dict(strict=False)``); the keys it lacks keep their random values."""
    from safetensors.torch import load_file

    state = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        state.update(load_file(str(file), device=device))
    if not state:
        raise FileNotFoundError(f"{checkpoint}: no *.safetensors")
    info = model.load_state_dict(state, strict=False)
    return {"path": str(checkpoint), "tensors": len(state), "missing": sorted(info.missing_keys),
            "unexpected": sorted(info.unexpected_keys)}  # fmt: skip


def build_reference(src: Path, config: dict, device: str, dtype: torch.dtype, checkpoint: Path | None):
    """The reference MiniCPMO with random weights made on ``device`` (or a checkpoint's), plus its
    DuplexCapability; returns the model and what the checkpoint loaded (None without one)."""
    sys.path.insert(0, str(src))
    from MiniCPMO45.configuration_minicpmo import MiniCPMOConfig
    from MiniCPMO45.modeling_minicpmo_unified import DuplexCapability, MiniCPMO, ProcessorMode

    cfg = MiniCPMOConfig(**config)
    cfg._attn_implementation = "sdpa"
    cfg._name_or_path = str(src / "MiniCPMO45")  # the processor and tokenizer files the package reads
    torch.manual_seed(0)
    with torch.device(device):
        model = MiniCPMO(cfg)
    with torch.no_grad():  # zero-initialised parameters (the resampler's) would time a faster, unreal model
        for param in model.parameters():
            if not param.any():
                param.normal_(0.0, 0.02)
    loaded = None if checkpoint is None else load_checkpoint(model, checkpoint, device)
    if dtype == torch.bfloat16:
        model.bfloat16()
    model.eval().to(device)  # also moves what the constructor put on the CPU (the resampler's pos_embed)
    # init_unified without its vocoder: DuplexCapability from the demo's DuplexConfig defaults
    model.duplex = DuplexCapability(
        model=model, device=device, generate_audio=True, ls_mode="explicit", max_new_speak_tokens_per_chunk=20,
        temperature=0.7, top_k=20, top_p=0.8, force_listen_count=3,
    )  # fmt: skip
    model._unified_initialized = True
    model.set_mode(ProcessorMode.DUPLEX)
    duplex = model.duplex
    with torch.no_grad():  # a speaking unit keeps speaking (see the module docstring)
        rows = {duplex.listen_token_id, duplex.decoder.listen_id, duplex.chunk_eos_token_id,
                duplex.chunk_tts_eos_token_id, duplex.turn_eos_token_id}  # fmt: skip
        for tok in rows:
            model.llm.lm_head.weight[tok].zero_()
    return model, loaded


def save_checkpoint(model, config: dict, src: Path, out: Path) -> int:
    """The reference's weights as a published-layout checkpoint (config.json, model.safetensors, the reference
    folder's tokenizer files), for Parley's bench to load the same weights; returns the tensor count."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for name in ("added_tokens.json", "generation_config.json", "merges.txt", "preprocessor_config.json",
                 "special_tokens_map.json", "tokenizer_config.json", "vocab.json"):  # fmt: skip
        (out / name).write_bytes((src / "MiniCPMO45" / name).read_bytes())
    return len(state)


class TtsTimer:
    """Wraps the TTS instance's ``generate_chunk``: device synchronised around each call, the time kept."""

    def __init__(self, tts) -> None:
        self.inner = tts.generate_chunk
        self.ms = 0.0
        tts.generate_chunk = self

    def __call__(self, *args, **kwargs):
        sync()
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        sync()
        self.ms += (time.perf_counter() - t0) * 1000
        return out


def timed(fn, *args, **kwargs):
    sync()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the reference prints every speaking unit's text
        out = fn(*args, **kwargs)
    sync()
    return out, (time.perf_counter() - t0) * 1000


def one_session(model, timer: TtsTimer, audio_units: int, omni_units: int, seed: int) -> dict:
    """prepare + audio units + omni units, every stage timed; the demo's cleanup first."""
    from PIL import Image

    duplex = model.duplex
    duplex._reset_streaming_state()  # DuplexView.cleanup, as after a previous call
    duplex.decoder.reset()
    model.reset_session(reset_token2wav_cache=True)
    ref = make_audio(2, seed + 1)
    audio = make_audio(audio_units + omni_units, seed)
    frame = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (448, 448, 3), dtype=np.uint8))
    torch.manual_seed(seed)  # the TTS codes are sampled (temperature 0.8), as in the demo
    _, prepare_ms = timed(
        model.duplex_prepare,
        prefix_system_prompt=f"<|im_start|>system\n{SYSTEM_PROMPT}\n<|audio_start|>",
        suffix_system_prompt="<|audio_end|><|im_end|>",
        ref_audio=ref,
        prompt_wav_path=None,  # no vocoder (module docstring)
    )
    units = []
    for u in range(audio_units + omni_units):
        omni = u >= audio_units
        chunk = audio[u * 16000 : (u + 1) * 16000]
        pre, prefill_ms = timed(model.duplex_prefill, audio_waveform=chunk, frame_list=[frame] if omni else None,
                                max_slice_nums=1)  # fmt: skip
        if not pre.get("success"):
            raise RuntimeError(f"unit {u}: prefill failed: {pre.get('reason')}")
        timer.ms = 0.0
        result, generate_ms = timed(
            model.duplex_generate, decode_mode="greedy", temperature=0.7, top_k=20, top_p=0.8,
            listen_prob_scale=1.0, listen_top_k=None, text_repetition_penalty=1.05, text_repetition_window_size=512,
            length_penalty=1.1, force_listen_override=not speaks(0, u),
        )  # fmt: skip
        tts_ms = timer.ms
        kv = duplex.decoder.get_cache_length()
        _, finalize_ms = timed(model.duplex_finalize)
        kind = ("omni_" if omni else "") + ("listen" if result["is_listen"] else "speak")
        units.append({
            "unit": u, "kind": kind, "prefill": prefill_ms, "generate": generate_ms, "llm": generate_ms - tts_ms,
            "tts": tts_ms, "finalize": finalize_ms, "unit_ms": prefill_ms + generate_ms + finalize_ms,
            "n_tokens": result["n_tokens"], "n_tts_tokens": result["n_tts_tokens"], "kv_len": kv,
        })  # fmt: skip
    per_kind = {}
    for kind in KINDS:
        rows = [r for r in units if r["kind"] == kind]
        per_kind[kind] = {s: summary([r["unit_ms" if s == "unit" else s] for r in rows], suffix="_ms", digits=1,
                                     median=True) for s in STAGES}  # fmt: skip
    return {"prepare_ms": round(prepare_ms, 1), "per_kind": per_kind,
            "units": [{k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()} for r in units]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", type=Path, required=True, help="folder holding MiniCPMO45/ (unit-reference-src.sh)")
    parser.add_argument("--tiny", action="store_true", help="the golden pack's tiny config (a CPU smoke run)")
    parser.add_argument("--checkpoint", type=Path, help="a published-layout checkpoint dir: its weights, not random")
    parser.add_argument("--save-checkpoint", type=Path, help="also write the weights used as a published-layout dir")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--audio-units", type=int, default=20)
    parser.add_argument("--omni-units", type=int, default=10)
    parser.add_argument("--warm-units", default="6,2", help="audio,omni units of the first (unmeasured) session")
    parser.add_argument("--out", default=None, help="a file, or a directory for the named result")
    args = parser.parse_args()
    t_start = time.perf_counter()
    torch.set_grad_enabled(False)
    src = args.src.resolve()
    if not (src / "MiniCPMO45" / "modeling_minicpmo_unified.py").is_file():
        parser.error(f"{src}/MiniCPMO45 not found: run scripts/unit-reference-src.sh first")
    tiny = json.loads((DATA / "config.json").read_text())
    if args.checkpoint:
        config = json.loads((args.checkpoint / "config.json").read_text())
    else:
        config = tiny if args.tiny else merged(tiny, REAL_45)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model, loaded = build_reference(src, config, args.device, dtype, args.checkpoint)
    if loaded:
        print(
            f"checkpoint: {loaded['tensors']} tensors, {len(loaded['missing'])} parameters missing (random), "
            f"{len(loaded['unexpected'])} unexpected",
            flush=True,
        )
    params = sum(p.numel() for p in model.parameters())
    build_s = time.perf_counter() - t_start
    print(f"reference built: {params / 1e9:.3f} B parameters, {dtype} on {args.device}, {build_s:.0f} s", flush=True)
    if args.save_checkpoint:  # lm_head rows already zeroed: bench/unit_gpu.py zeroes the same ones
        n = save_checkpoint(model, config, src, args.save_checkpoint)
        print(f"wrote {n} tensors to {args.save_checkpoint}", flush=True)
    cuda = args.device.startswith("cuda")
    weights_gb = torch.cuda.memory_allocated() / 1e9 if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()  # the fp32 build's peak is not the serving one
    timer = TtsTimer(model.tts)
    sessions = []
    warm_audio, warm_omni = (int(n) for n in args.warm_units.split(","))
    for seed, audio_units, omni_units in ((7, warm_audio, warm_omni), (11, args.audio_units, args.omni_units)):
        # two back to back: the first meets the shapes once, the second is the measurement
        run = one_session(model, timer, audio_units, omni_units, seed)
        sessions.append(run)
        brief = {k: v["unit"] for k, v in run["per_kind"].items()}
        print(f"session seed {seed}: prepare {run['prepare_ms']} ms, units {json.dumps(brief)}", flush=True)
    import transformers

    shapes = "the checkpoint's" if args.checkpoint else "the tiny golden-pack" if args.tiny else "the real"

    commit = src / "COMMIT"
    result = {
        "bench": "unit_reference",
        "reference": "OpenBMB/MiniCPM-o-Demo MiniCPMO45 (modeling_minicpmo_unified), unmodified, at "
        + (commit.read_text().strip() if commit.is_file() else "an unknown commit"),
        "model": f"{'checkpoint' if args.checkpoint else 'random'} MiniCPM-o 4.5 at {shapes} shapes "
        f"({params / 1e9:.3f} B parameters), {dtype} on {args.device}, sdpa",
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "speaking_rule": "unit u speaks when u >= 3 and u % 5 in (1, 3), else force_listen_override; the listen, "
        "chunk_eos, chunk_tts_eos and turn_eos rows of lm_head zeroed (as bench/unit_gpu.py)",
        "stages": "device synchronised around each: prefill, generate (llm + tts; tts = generate_chunk calls), "
        "finalize; unit = prefill + generate + finalize; no vocoder",
        "weights": loaded or "random, made on the device (torch.manual_seed(0), then zero parameters ~N(0, 0.02))",
        "build_s": round(build_s, 1),
        "measurement": sessions[1],
        "first_session": {k: sessions[0][k] for k in ("prepare_ms", "per_kind")},
        "allocated_after_build_gb": None if weights_gb is None else round(weights_gb, 2),
        "peak_allocated_sessions_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if cuda else None,
    }
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    out = write_result(result, "unit-reference" + ("-tiny" if args.tiny else ""), gpu=cuda, out=args.out)
    for kind, stages in sessions[1]["per_kind"].items():
        print(kind, json.dumps({s: {k: v for k, v in st.items() if k != "max_ms"} for s, st in stages.items()}))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
