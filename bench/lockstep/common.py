"""Shared helpers of the lockstep benchmark: statistics, logging, memory, the results file."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import torch

from bench.stats import summary

GiB = 1024**3
FRAME_MS = 80.0


def stats(times_ms: list[float]) -> dict:
    return summary(times_ms, digits=3, median=True)


def log(*args) -> None:
    print(*args, flush=True)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def save(results: dict, out: str | None) -> None:
    """Write the results to ``out`` and, on the device machine, to ``$OUT/lockstep.json`` as well."""
    for path in filter(None, [out, os.environ.get("OUT") and os.path.join(os.environ["OUT"], "lockstep.json")]):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(results, indent=1, default=str))
