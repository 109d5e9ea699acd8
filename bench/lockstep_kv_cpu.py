"""The KV format's cost on the tiny golden PersonaPlex checkpoint, on this CPU: fp32 reference KV vs fp8 KV.

The fast path's CPU twins run (the fp8 quantisation and the attention over dequantised rings are the torch
versions of the Triton kernels). Every session first replays the golden prefill (voice prompt + persona); session
0 then gets the golden user codes, so the fp32 run must reproduce the reference's golden tokens exactly and the
fp8 run is compared with them too; sessions 1-7 get random user codes. Two lengths: the golden session's 150
frames, and 500 frames (the tiny model's KV ring holds 299, so the second also wraps it).

Usage::

    .venv/bin/python bench/lockstep_kv_cpu.py [--out DIR_OR_FILE]   (default: bench/results/lockstep-kv-tiny-<cores>core-<commit>.json)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.lockstep.kv_format import compare_kv_formats, forced_against  # noqa: E402
from bench.results_io import write_result  # noqa: E402
from inference.models.moshi.config import read_checkpoint_dir  # noqa: E402
from inference.models.moshi.fast.model import FastLM  # noqa: E402
from inference.models.moshi.fast.session import run_prefill  # noqa: E402
from inference.models.moshi.loading import load_lm  # noqa: E402
from inference.models.moshi.personaplex import build_prefill, load_voice_prompt, voice_frames_from_prompt  # noqa: E402

DATA = ROOT / "tests" / "data" / "personaplex"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="a file, or a directory for the named result")
    p.add_argument("--sessions", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(1)
    info = read_checkpoint_dir(DATA / "ckpt")
    lm = load_lm(info.moshi_weights, info.lm)
    fl = FastLM(lm)
    meta = json.loads((DATA / "golden.json").read_text())
    golden = np.load(DATA / "golden.npy")
    codes = torch.from_numpy(np.load(DATA / "user_codes.npy")).T.contiguous()  # [frames, 8]

    def prepare(ls, step) -> None:
        prompt = load_voice_prompt(DATA / "voice_prompt.pt", info.lm, ls.ct)
        frames = build_prefill(
            info.lm, voice=voice_frames_from_prompt(info.lm, prompt), persona_ids=meta["text_prompt_tokens"]
        ).frames
        run_prefill(step, ls, list(range(ls.num_slots)), frames)

    results = {
        "command": "python bench/lockstep_kv_cpu.py",
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "checkpoint": "tests/data/personaplex/ckpt (tiny, fp32)",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    for frames in (len(golden), 500):
        t0 = time.time()
        r = compare_kv_formats(fl, args.sessions, frames, prepare=prepare, first_codes=codes, golden=golden)
        r["wall_s"] = round(time.time() - t0, 1)
        results[f"frames_{frames}"] = r
        short = {k: v for k, v in r.items() if k != "teacher_forced_text_kl_per_frame_mean"}
        print(json.dumps(short), flush=True)
    # the KV format's error next to the serving dtype's own: the same weights in bf16 (bf16 KV, fp8 KV), each
    # teacher-forced on the fp32 run's tokens
    lm16 = load_lm(info.moshi_weights, info.lm, dtype=torch.bfloat16)
    fl16 = FastLM(lm16)
    user_codes = torch.randint(0, 2048, (args.sessions, 500, 8), generator=torch.Generator().manual_seed(0))
    user_codes[0, : len(codes)] = codes
    others = {
        "fp32_weights_fp8_kv": (fl, True),
        "bf16_weights_bf16_kv": (fl16, False),
        "bf16_weights_fp8_kv": (fl16, True),
    }
    results["against_fp32_teacher_forced_500"] = forced_against(fl, others, user_codes, prepare)
    print(json.dumps(results["against_fp32_teacher_forced_500"]), flush=True)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"wrote {write_result(results, 'lockstep-kv-tiny', out=args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
