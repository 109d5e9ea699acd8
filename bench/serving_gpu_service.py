"""The lockstep inference service bench/serving_e2e.py drives on the GPU host: ``python -m inference serve``'s
service and socket, but with the engine built as ``bench/lockstep/paged.py`` builds it (PersonaPlex 7B shape,
random bf16 weights made on the GPU, fast path, fp8 KV in a paged pool), since the host holds no checkpoint.

Settings come from the environment as for ``serve`` (``PARLEY_SLOTS``, ``PARLEY_KV_PAGE_FRAMES``,
``PARLEY_KV_MEAN_CALL_S``, ``PARLEY_INFERENCE_TOKEN`` ...); the KV pool is the card's free memory less the
codec's per-slot state and ``--reserve-gib``, as the paged bench sizes it. ``--tiny`` serves the repository's
tiny PersonaPlex checkpoint on the CPU instead (to try the plumbing here).

    python3 bench/serving_gpu_service.py --socket /tmp/x/inference.sock
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TINY_CHECKPOINT = ROOT / "tests" / "data" / "personaplex" / "ckpt"


def build_engine(config, tmp: Path, reserve_gib: float, tiny: bool):
    from inference.engines.lockstep import LockstepEngine

    if tiny:
        engine = LockstepEngine(TINY_CHECKPOINT, config.slots, device="cpu", dtype="float32")
        engine.warmup()
        return engine
    import sentencepiece as spm

    from bench.lockstep.against_reference import checkpoint_dir
    from bench.lockstep.codec import build_mimi
    from bench.lockstep.paged import build_native_random, pool_gb_for
    from inference.engines.lockstep_fast_backend import KVPaging

    lm = build_native_random(16)
    pool_gb = pool_gb_for(lm, config.slots, reserve_gib)
    paging = KVPaging(
        page_frames=config.kv_page_frames or 128,
        pool_gb=pool_gb,
        mean_call_frames=round(config.kv_mean_call_s * 12.5),
    )
    ckpt = checkpoint_dir(tmp)
    engine = LockstepEngine(ckpt, config.slots, device="cuda", dtype="bfloat16", kv_fp8=True, kv_paging=paging)
    tokenizer = spm.SentencePieceProcessor(model_file=str(ckpt / "tokenizer.model"))
    t0 = time.time()
    engine.warmup(loaded=(lm, build_mimi(), tokenizer))
    print(f"engine warm in {time.time() - t0:.1f} s, KV pool {pool_gb} GB, pages {paging}", flush=True)
    return engine


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--reserve-gib", type=float, default=7.0)
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args()
    from inference.config import InferenceConfig
    from inference.log_format import configure_logging
    from inference.service import InferenceService
    from inference.transport.server import serve

    config = InferenceConfig.from_env().with_overrides(engine="lockstep")
    configure_logging(json_lines=config.log_json)

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            engine = await asyncio.to_thread(build_engine, config, Path(tmp), args.reserve_gib, args.tiny)
            service = InferenceService(config, engine, warmed=True)
            await service.start()
            print(f"serving lockstep with {config.slots} slots on {args.socket}", flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await serve(service, args.socket, stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
