"""Run the reference Mimi (moshi 0.2.13) on given inputs and write its outputs; executed in `.venv-moshi-ref`.

Usage (NO_TORCH_COMPILE=1 is required on CPU):
    python mimi_ref_runner.py --weights W.safetensors --config mimi_config.json --inputs in.npz --out out.npz
    python mimi_ref_runner.py --describe-default --out keys.json

The second form writes {key: shape} of the published full-size Mimi's state dict (random init, no weights).

`in.npz` holds `pcm` float32 [B, 1, T] (T a multiple of the frame size) and `codes` int64 [B, K, F].
`out.npz` receives, for K = codes.shape[1]:
    codes_whole  [B, K, T/frame]  one-shot `mimi.encode(pcm)`
    codes_stream [B, K, T/frame]  frame-by-frame `mimi.encode` inside `mimi.streaming(B)`
    pcm_whole    [B, 1, F*frame]  one-shot `mimi.decode(codes)`
    pcm_stream   [B, 1, F*frame]  frame-by-frame `mimi.decode` inside `mimi.streaming(B)`
This file imports only the reference package: it must not import anything from the project.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from moshi.models.loaders import get_mimi


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights")
    parser.add_argument("--config")
    parser.add_argument("--inputs")
    parser.add_argument("--describe-default", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    if args.describe_default:
        mimi = get_mimi(None, device="cpu", num_codebooks=8)
        with open(args.out, "w") as f:
            json.dump({k: list(v.shape) for k, v in mimi.state_dict().items()}, f)
        return

    torch.set_num_threads(1)
    with open(args.config) as f:
        config = json.load(f)
    inputs = np.load(args.inputs)
    pcm = torch.from_numpy(inputs["pcm"]).float()
    codes = torch.from_numpy(inputs["codes"]).long()
    batch, num_codebooks = codes.shape[0], codes.shape[1]

    mimi = get_mimi(args.weights, config, device="cpu", num_codebooks=num_codebooks)
    frame = mimi.frame_size
    out: dict[str, np.ndarray] = {}
    with torch.no_grad():
        out["codes_whole"] = mimi.encode(pcm).numpy()
        with mimi.streaming(batch):
            steps = [mimi.encode(pcm[..., i : i + frame]) for i in range(0, pcm.shape[-1], frame)]
        out["codes_stream"] = torch.cat(steps, dim=-1).numpy()
        out["pcm_whole"] = mimi.decode(codes).numpy()
        with mimi.streaming(batch):
            steps = [mimi.decode(codes[..., t : t + 1]) for t in range(codes.shape[-1])]
        out["pcm_stream"] = torch.cat(steps, dim=-1).numpy()
    np.savez(args.out, **out)


if __name__ == "__main__":
    main()
