"""Where a benchmark's result goes and how it is written: ``bench/results/<what>-<hardware>-<commit>.json``.

Every script in bench/ that keeps a result writes it through ``write_result``, so a file's name always says what
was measured, on which machine, at which commit, and one configuration re-measured at a newer commit gets a new
name instead of a suffix. The commit comes from git (``BENCH_COMMIT`` overrides it: the device machine's copy of
the tree has no ``.git``); the hardware is the GPU's model for GPU runs (``h200``) and the core count for CPU
runs (``2core``), ``BENCH_HARDWARE`` overrides it. The file also records both, and whether the tree had
uncommitted changes when it ran (then the commit is the one those changes sit on).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> str:
    """The short hash of the checked-out commit, ``BENCH_COMMIT`` if set, ``nogit`` outside a git checkout."""
    return os.environ.get("BENCH_COMMIT") or _git("rev-parse", "--short=7", "HEAD") or "nogit"


def tree_dirty() -> bool | None:
    """Whether tracked files differ from the commit (None when git cannot tell)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def _gpu_model() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = done.stdout.split("\n") if done.returncode == 0 else []
    return gpu_model_of(names[0]) if names else None


def gpu_model_of(name: str) -> str | None:
    """The model in a GPU's name: "NVIDIA H200" -> "h200", "NVIDIA H100 80GB HBM3" -> "h100" (the first word that
    is a letter and digits, not the memory's size or kind), else the name's last word."""
    words = name.split()
    for word in words:
        if re.fullmatch(r"[A-Za-z]+\d+[A-Za-z]?", word) and not re.fullmatch(r"(?i)hbm\d+e?", word):
            return word.lower()
    return words[-1].lower() if words else None


def hardware(gpu: bool) -> str:
    """``BENCH_HARDWARE`` if set; else the GPU's model (``gpu``) or this host's core count (``2core``)."""
    if os.environ.get("BENCH_HARDWARE"):
        return os.environ["BENCH_HARDWARE"]
    if gpu:
        return _gpu_model() or "gpu"
    return f"{os.cpu_count() or 1}core"


def _slug(part: str) -> str:
    slug = re.sub(r"[^a-z0-9.]+", "-", part.lower()).strip("-")
    if not slug:
        raise ValueError(f"a result name part must have letters or digits: {part!r}")
    return slug


def result_name(what: str, hardware_name: str, commit_hash: str) -> str:
    """``lockstep-capacity`` + ``h200`` + ``101a038`` -> ``lockstep-capacity-h200-101a038.json``."""
    return f"{_slug(what)}-{_slug(hardware_name)}-{_slug(commit_hash)}.json"


def result_path(what: str, *, gpu: bool = False, out: str | Path | None = None) -> Path:
    """The file to write: ``out`` itself if it names a file, else ``<what>-<hardware>-<commit>.json`` inside
    ``out`` (a directory, e.g. the device machine's ``$OUT``) or inside bench/results/."""
    if out is not None and not Path(out).is_dir() and Path(out).suffix:
        return Path(out)
    directory = Path(out) if out is not None else RESULTS
    return directory / result_name(what, hardware(gpu), commit())


def write_result(result: dict, what: str, *, gpu: bool = False, out: str | Path | None = None) -> Path:
    """Write ``result`` as JSON to ``result_path(what, gpu=gpu, out=out)``, recording the commit, hardware and
    whether the tree was dirty (unless the result already says), and return the path."""
    path = result_path(what, gpu=gpu, out=out)
    result.setdefault("commit", commit())
    result.setdefault("hardware", hardware(gpu))
    result.setdefault("tree_dirty", tree_dirty())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return path
