"""Runs INSIDE .venv-moshi-ref (moshi 0.2.13, NO_TORCH_COMPILE=1): the reference side of the parity tests.

Builds moshi's own ``LMModel`` from a Parley checkpoint directory (config.json kwargs), loads its fused
safetensors strictly, and dumps the stacked non-None outputs of ``LMGen(use_sampling=False).step``.

    python ref_runner.py CKPT_DIR USER_CODES.npy OUT.npy
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from moshi.models.lm import LMGen, LMModel
from safetensors.torch import load_file

NON_LM_KEYS = (
    "moshi_name",
    "mimi_name",
    "mimi_config_name",
    "tokenizer_name",
    "lora_name",
    "model_type",
    "lm_gen_config",
    "tts_config",
    "stt_config",
    "model_id",
    "parley_demo",
)


def main() -> None:
    ckpt, codes_path, out_path = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    kwargs = json.loads((ckpt / "config.json").read_text())
    for key in NON_LM_KEYS:
        kwargs.pop(key, None)
    torch.manual_seed(0)
    lm = LMModel(device="cpu", dtype=torch.float32, **kwargs)
    lm.load_state_dict(load_file(str(ckpt / "model.safetensors")), strict=True)
    lm.eval()
    codes = torch.from_numpy(np.load(codes_path)).long()
    squeeze = codes.dim() == 2
    if squeeze:
        codes = codes[None]
    gen = LMGen(lm, use_sampling=False)
    outs = []
    with torch.no_grad(), gen.streaming(codes.shape[0]):
        for t in range(codes.shape[2]):
            tok = gen.step(codes[:, :, t : t + 1])
            if tok is not None:
                outs.append(tok[:, :, 0])
    out = torch.stack(outs, dim=1).numpy().astype(np.int64)  # [B, T-1, 1+dep_q]
    np.save(out_path, out[0] if squeeze else out)


if __name__ == "__main__":
    main()
