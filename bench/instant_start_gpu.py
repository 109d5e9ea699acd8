"""Instant start on one GPU: time to first agent audio of a joining PersonaPlex session, with and without the
prefill cache, on a PersonaPlex-shaped 7B (dep_q 16, the published 7B widths) with random bf16 weights.

The LM weights are drawn on the GPU and written as a checkpoint directory next to a tiny checkpoint's Mimi and
tokenizer (the codec's size does not change what is measured: the prefill is LM passes). A ``LockstepEngine``
(fast path: CUDA graphs) serves 3 slots: 2 live sessions and the joiner, whose voice prompt is a 10 s wav and
whose persona is a sentence; ``bench/lockstep_cpu.py``'s ``time_to_first_audio`` paces the ticks at 80 ms.

Usage (on a GPU machine):
    python bench/instant_start_gpu.py [--out DIR_OR_FILE]   (default: bench/results/instant-start-<gpu>-<commit>.json)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lockstep_cpu import speech_like, time_to_first_audio  # noqa: E402

from bench.results_io import write_result  # noqa: E402
from inference.engines.base import SlotConfig, SlotInput, VoiceRef  # noqa: E402
from inference.engines.lockstep import LockstepEngine  # noqa: E402
from inference.models.moshi.config import LMConfig  # noqa: E402
from inference.models.moshi.lm import MoshiLM  # noqa: E402
from inference.models.moshi.make_checkpoint import LM_GEN_CONFIG, make_checkpoint  # noqa: E402

LM_KWARGS = {"dep_q": 16}  # every other LM argument takes the published 7B value


def write_7b_checkpoint(out: Path, seed: int = 0) -> None:
    """Random bf16 weights drawn on the GPU (seconds, not the minutes a CPU fp32 draw of 7B takes)."""
    tiny = make_checkpoint("tiny-personaplex", out.parent / "tiny", seed)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("mimi.safetensors", "mimi_config.json", "tokenizer.model"):
        shutil.copy(tiny / name, out / name)
    config = LMConfig.from_lm_kwargs(LM_KWARGS)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in MoshiLM(config).state_dict().items()}
    gen = torch.Generator(device="cuda").manual_seed(seed)
    state = {}
    for key in sorted(shapes):
        noise = torch.randn(shapes[key], generator=gen, device="cuda", dtype=torch.bfloat16)
        state[key] = (1.0 + 0.1 * noise if key.endswith("alpha") else noise / (shapes[key][-1] ** 0.5)).cpu()
    save_file(state, str(out / "model.safetensors"))
    raw = dict(LM_KWARGS, moshi_name="model.safetensors", mimi_name="mimi.safetensors", tokenizer_name="tokenizer.model",
               mimi_config_name="mimi_config.json", model_type="moshi", lm_gen_config=dict(LM_GEN_CONFIG),
               parley_demo=True)  # fmt: skip
    (out / "config.json").write_text(json.dumps(raw, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="a file, or a directory for the named result")
    parser.add_argument("--voice-seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        ckpt = Path(tmp) / "ckpt"
        write_7b_checkpoint(ckpt)
        written_s = time.perf_counter() - started
        voice_wav = Path(tmp) / "voice.wav"
        soundfile.write(voice_wav, speech_like(3, int(args.voice_seconds * 12.5)), 24_000)
        engine = LockstepEngine(ckpt, 3, device="cuda", dtype="bfloat16")
        t0 = time.perf_counter()
        engine.warmup()
        warmup_s = time.perf_counter() - t0
        frames = 4000
        audio = {0: speech_like(0, frames), 1: speech_like(1, frames)}
        for s in (0, 1):
            engine.open_slot(s, SlotConfig(persona="You are a helpful assistant."))
        while any(o.prefilling for o in engine.step({}).values()):
            pass
        frame = 0
        for _ in range(20):  # settle the two live sessions
            engine.step({s: SlotInput(audio=audio[s][frame * 1920 : (frame + 1) * 1920]) for s in (0, 1)})
            frame += 1
        config = SlotConfig(persona="You are a patient museum guide who loves old maps.", voice=VoiceRef("v", voice_wav))
        entries, engine.prefill_cache.max_entries = engine.prefill_cache.max_entries, 0
        uncached, frame = time_to_first_audio(engine, audio, frame, config)
        engine.prefill_cache.max_entries = entries
        _, frame = time_to_first_audio(engine, audio, frame, config)  # fills the cache
        cached, frame = time_to_first_audio(engine, audio, frame, config)
        snapshot_bytes = engine.prefill_cache.nbytes  # one entry: this start
    result = {
        "what": "time to first agent audio of a joining PersonaPlex session next to 2 live ones, 7B shape, random "
        "bf16 weights, fast path (CUDA graphs), ticks paced at 80 ms",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "checkpoint_written_s": written_s,
        "warmup_s": warmup_s,
        "voice_prompt_s": args.voice_seconds,
        "prefill_budget_ms": engine.prefill_budget_ms,
        "first_agent_audio_without_prefill_cache": uncached,
        "first_agent_audio_with_prefill_cache": cached,
        "snapshot_bytes": snapshot_bytes,
    }
    for label, r in (("without", uncached), ("with", cached)):
        print(f"first agent audio {label} the prefill cache: {r['ms']:.1f} ms ({r['ticks']} ticks)")
    print(f"snapshot: {snapshot_bytes / 1e6:.1f} MB on the device")
    print(f"wrote {write_result(result, 'instant-start', gpu=True, out=args.out)}")
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
