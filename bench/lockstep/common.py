"""Shared helpers of the lockstep benchmark: statistics, logging, memory, the results file."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import torch

from bench.results_io import write_result
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


def save(results: dict, out: Path) -> None:
    """Write the results to ``out`` (a named result file: rewritten after each section, so a later crash keeps the
    earlier numbers) and, on the device machine, under the same name into ``$OUT`` as well."""
    for path in filter(None, [out, os.environ.get("OUT") and Path(os.environ["OUT"]) / out.name]):
        write_result(results, out.stem, gpu=True, out=path)
