"""The inference service bench/serving_e2e.py drives on the GPU host: ``python -m inference serve``'s service and
socket, but with the engine built from random weights, since the host holds no checkpoint:

- ``--engine lockstep`` (default): as ``bench/lockstep/paged.py`` builds it (PersonaPlex 7B shape, random bf16
  weights made on the GPU, fast path, fp8 KV in a paged pool);
- ``--engine unit``: MiniCPM-o 4.5 at the real shapes as ``bench/unit_gpu.py`` builds it, the fast runner, units
  speaking as in its capacity rows (``bench/serving_unit_engine.py``); ``--vocoder token2wav`` adds random
  Token2Wav assets at the published shapes (default ``none``: silence, as the capacity rows time the unit).

Settings come from the environment as for ``serve`` (``PARLEY_SLOTS``, ``PARLEY_KV_PAGE_FRAMES``,
``PARLEY_KV_MEAN_CALL_S``, ``PARLEY_INFERENCE_TOKEN`` ...); the KV pool is the card's free memory less the
codec's per-slot state and ``--reserve-gib``, as the paged bench sizes it. ``--tiny`` serves the repository's
tiny checkpoint of the engine on the CPU instead (to try the plumbing here).

    python3 bench/serving_gpu_service.py --socket /tmp/x/inference.sock
    python3 bench/serving_gpu_service.py --engine unit --socket /tmp/x/inference.sock   # PARLEY_SLOTS=64
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


def build_engine(config, tmp: Path, args):
    if args.engine == "unit":
        from bench.serving_unit_engine import build_unit_engine

        t0 = time.time()
        engine = build_unit_engine(config.slots, tmp, tiny=args.tiny, vocoder=args.vocoder, context=config.unit_context)
        print(
            f"unit engine warm in {time.time() - t0:.1f} s, vocoder {engine.vocoder.name}, context {engine.context}",
            flush=True,
        )
        return engine
    return build_lockstep(config, tmp, args.reserve_gib, args.tiny)


def build_lockstep(config, tmp: Path, reserve_gib: float, tiny: bool):
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
    p.add_argument("--engine", choices=("lockstep", "unit"), default="lockstep")
    p.add_argument("--vocoder", choices=("none", "token2wav"), default="none", help="unit engine: its vocoder")
    args = p.parse_args()
    from inference.config import InferenceConfig
    from inference.log_format import configure_logging
    from inference.service import InferenceService
    from inference.transport.server import serve

    config = InferenceConfig.from_env().with_overrides(engine=args.engine)
    configure_logging(json_lines=config.log_json)

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            engine = await asyncio.to_thread(build_engine, config, Path(tmp), args)
            service = InferenceService(config, engine, warmed=True)
            await service.start()
            print(f"serving {args.engine} with {config.slots} slots on {args.socket}", flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await serve(service, args.socket, stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
