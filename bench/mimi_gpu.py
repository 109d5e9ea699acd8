"""Benchmark and sanity-check the native Mimi on a CUDA device (run by hand on a GPU machine).

    .venv/bin/python bench/mimi_gpu.py [--out DIR_OR_FILE]   (default: bench/results/mimi-<gpu>-<commit>.json)

Full-size (published) config with random weights, fp32, TF32 off. Reports, per batch size: eager ms per
encode_step / decode_step, CUDA-graphed ms for one encode+decode tick, and checks on the device that streaming
decode equals whole-clip decode, that a graphed tick equals an eager one, and that batch rows are independent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.results_io import write_result  # noqa: E402
from inference.models.moshi.mimi import MimiCodec, MimiConfig  # noqa: E402
from inference.models.moshi.mimi_loading import random_mimi_state_dict  # noqa: E402

FRAME = 1920


def timed(fn, repeats: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1000


def stream(codec: MimiCodec, pcm: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    state = codec.init_stream(pcm.shape[0])
    enc = torch.cat([codec.encode_step(pcm[..., i : i + FRAME], state) for i in range(0, pcm.shape[-1], FRAME)], -1)
    dec = torch.cat([codec.decode_step(codes[..., t : t + 1], state) for t in range(codes.shape[-1])], -1)
    return enc, dec


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None, help="a file, or a directory for the named result")
    parser.add_argument("--batches", default="1,8,32,64")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    config = MimiConfig.kyutai_default()
    codec = MimiCodec(config, num_codebooks=8)
    codec.load_state_dict(random_mimi_state_dict(config, 0))
    codec = codec.to(device).eval()
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "batches": {}}

    generator = torch.Generator(device="cpu").manual_seed(0)
    pcm = (torch.randn(2, 1, 30 * FRAME, generator=generator) * 0.1).to(device)
    codes = torch.randint(0, 2048, (2, 8, 30), generator=generator).to(device)
    enc, dec = stream(codec, pcm, codes)
    report["stream_vs_whole"] = {
        "codes_equal": bool(torch.equal(enc, codec.encode(pcm))),
        "decode_max_abs_diff": float((dec - codec.decode(codes)).abs().max()),
        "decode_peak": float(dec.abs().max()),
    }
    enc1, dec1 = stream(codec, pcm[1:], codes[1:])
    report["row_independent"] = {
        "codes_equal": bool(torch.equal(enc1[0], enc[1])),
        "decode_max_abs_diff": float((dec1[0] - dec[1]).abs().max()),
    }

    for batch in [int(b) for b in args.batches.split(",")]:
        frame = (torch.randn(batch, 1, FRAME, generator=generator) * 0.1).to(device)
        frame_codes = torch.randint(0, 2048, (batch, 8, 1), generator=generator).to(device)
        state = codec.init_stream(batch)
        for _ in range(3):
            codec.encode_step(frame, state)
            codec.decode_step(frame_codes, state, validate=False)
        entry = {
            "encode_ms": timed(lambda: codec.encode_step(frame, state), 20),  # noqa: B023
            "decode_ms": timed(lambda: codec.decode_step(frame_codes, state, validate=False), 20),  # noqa: B023
        }
        # CUDA graph of one tick (encode + decode) on a fresh state, compared with the same tick run eagerly.
        graph_state, eager_state = codec.init_stream(batch), codec.init_stream(batch)
        static_in, static_codes = frame.clone(), frame_codes.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside capture, as CUDA graphs require
            warm = codec.init_stream(batch)
            codec.encode_step(static_in, warm)
            codec.decode_step(static_codes, warm, validate=False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                out_codes = codec.encode_step(static_in, graph_state)
                out_pcm = codec.decode_step(static_codes, graph_state, validate=False)
            steps_equal, max_diff = True, 0.0
            for _ in range(5):
                graph.replay()
                ref_codes = codec.encode_step(static_in, eager_state)
                ref_pcm = codec.decode_step(static_codes, eager_state, validate=False)
                steps_equal &= bool(torch.equal(out_codes, ref_codes))
                max_diff = max(max_diff, float((out_pcm - ref_pcm).abs().max()))
            entry["graphed_tick_ms"] = timed(graph.replay, 50)
            entry["graph_codes_equal_eager"] = steps_equal
            entry["graph_pcm_max_abs_diff"] = max_diff
        except RuntimeError as exc:  # report, don't hide: capture is what the engine needs
            entry["graph_error"] = str(exc)[:500]
        report["batches"][batch] = entry
        print(batch, entry, flush=True)

    print(json.dumps(report, indent=1))
    print(f"wrote {write_result(report, 'mimi', gpu=True, out=args.out)}")


if __name__ == "__main__":
    main()
