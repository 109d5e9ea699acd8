"""``python -m inference make-minicpmo-checkpoint``: write a tiny random MiniCPM-o 4.5 checkpoint directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from inference.models.minicpmo.config import CheckpointError
from inference.models.minicpmo.fill import make_checkpoint

# The golden pack's data files (config.json, keys.txt, tokenizer/) live with the tests of this repo.
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[3] / "tests" / "data" / "minicpmo45"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument("--out", required=True, help="checkpoint directory to write")
    parser.add_argument("--seed", type=int, default=1234, help="fill seed (the goldens use 1234)")
    parser.add_argument("--std", type=float, default=0.05, help="scale of non-norm tensors")
    parser.add_argument("--no-vocoder", action="store_true", help="skip the tiny random Token2Wav assets")
    parser.add_argument(
        "--data-dir", default=str(DEFAULT_DATA_DIR), help="folder with config.json, keys.txt and tokenizer/"
    )


def run(args: argparse.Namespace) -> int:
    """Write the checkpoint; returns the exit status."""
    try:
        out = make_checkpoint(args.out, data_dir=args.data_dir, seed=args.seed, std=args.std)
        if not args.no_vocoder:  # tiny random Token2Wav assets: the demo speaks (noise)
            from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets
            from inference.models.minicpmo.vocoder import ASSET_SUBDIR

            make_token2wav_assets(out / ASSET_SUBDIR, seed=args.seed)
    except (CheckpointError, OSError) as exc:
        print(f"error: {exc}")
        return 2
    print(f"wrote tiny MiniCPM-o 4.5 checkpoint (seed {args.seed}) to {out}")
    return 0
