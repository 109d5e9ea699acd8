"""``python -m inference <command>``: the inference service and offline tools.

Each command lives with the code it drives; this file only dispatches, importing lazily so that
``serve`` does not pay for model imports it does not need.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, help). Each module defines add_arguments(parser) and run(args) -> int.
COMMANDS = {
    "serve": ("inference.serve", "run the co-located inference service"),
    "make-checkpoint": ("inference.models.moshi.make_checkpoint", "write a tiny random Moshi/PersonaPlex checkpoint"),
    "replay": ("inference.models.moshi.replay", "run the lockstep model on recorded user codes or audio"),
    "make-minicpmo-checkpoint": (
        "inference.models.minicpmo.make_checkpoint",
        "write a tiny random MiniCPM-o 4.5 checkpoint",
    ),
    "doctor": ("inference.checkpoints.doctor", "check a checkpoint (folder or hub id) and size it for a GPU"),
    "replay-units": ("inference.models.minicpmo.replay", "run the unit model on recorded audio, unit by unit"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference")
    sub = parser.add_subparsers(dest="command", required=True)
    argv = sys.argv[1:] if argv is None else argv
    wanted = argv[0] if argv else None
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == wanted:  # only import the module of the command being run
            importlib.import_module(module_name).add_arguments(p)
    args, _ = parser.parse_known_args(argv) if wanted not in COMMANDS else (parser.parse_args(argv), None)
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
