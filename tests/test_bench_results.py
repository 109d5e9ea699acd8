"""bench/results_io.py and what it keeps in order: results named ``<what>-<hardware>-<commit>``, written one way,
and every result a document points at present in bench/results/."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import results_io

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# A result file: what it measures, the hardware, the commit (and a side by side's second half, or a trace).
RESULT_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*-[a-z0-9]+-[0-9a-f]{7,40}(\.reference)?\.(json|jsonl\.gz)$")
# Names that say when something was measured instead of what: "stop" or "round" and a sequence number.
SEQUENCE_NAME = re.compile(r"stop ?[0-9]{2}|round ?[0-9]", re.IGNORECASE)


def git_head() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_result_name_says_what_hardware_and_commit():
    assert results_io.result_name("lockstep-capacity", "h200", "101a038") == "lockstep-capacity-h200-101a038.json"
    assert results_io.result_name("Latency echo/jitter", "2core", "aeb0979") == "latency-echo-jitter-2core-aeb0979.json"


def test_a_gpu_is_named_by_its_model_not_its_memory():
    # nvidia-smi's names as the device machines give them: an H100's ends in its memory's kind
    assert results_io.gpu_model_of("NVIDIA H200") == "h200"
    assert results_io.gpu_model_of("NVIDIA H100 80GB HBM3") == "h100"
    assert results_io.gpu_model_of("NVIDIA L40S") == "l40s"
    assert results_io.gpu_model_of("") is None


def test_a_name_part_without_letters_or_digits_is_refused():
    with pytest.raises(ValueError, match="letters or digits"):
        results_io.result_name("--", "h200", "101a038")


def test_write_result_names_the_file_from_git_and_this_host(tmp_path, monkeypatch):
    monkeypatch.delenv("BENCH_COMMIT", raising=False)
    monkeypatch.delenv("BENCH_HARDWARE", raising=False)
    path = results_io.write_result({"p99_ms": 1.5}, "demo-bench", out=tmp_path)
    assert path == tmp_path / f"demo-bench-{os.cpu_count()}core-{git_head()}.json"
    written = json.loads(path.read_text())
    assert written["p99_ms"] == 1.5
    assert written["commit"] == git_head() and written["hardware"] == f"{os.cpu_count()}core"
    assert isinstance(written["tree_dirty"], bool)


def test_the_device_machine_names_commit_and_hardware_through_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_COMMIT", "101a038")
    monkeypatch.setenv("BENCH_HARDWARE", "h200")
    path = results_io.write_result({}, "unit", gpu=True, out=tmp_path / "sub")
    assert path == tmp_path / "sub" / "unit-h200-101a038.json"
    assert json.loads(path.read_text())["commit"] == "101a038"


def test_an_out_that_names_a_file_is_used_as_it_is(tmp_path):
    path = results_io.write_result({"a": 1}, "ignored", out=tmp_path / "mine.json")
    assert path == tmp_path / "mine.json" and json.loads(path.read_text())["a"] == 1


def test_a_bench_script_writes_its_result_through_the_helper(tmp_path):
    """bench/transport.py for one client and one second through the facade (echo engine, this process):
    the file it leaves is the helper's name, in the directory given."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("BENCH_COMMIT", None)
    env.pop("BENCH_HARDWARE", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "transport.py"), "--via", "facade", "--clients", "1", "--seconds", "1",
         "--out", str(tmp_path)],  # fmt: skip
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (written,) = tmp_path.iterdir()
    assert written.name == f"transport-facade-1clients-{os.cpu_count()}core-{git_head()}.json"
    result = json.loads(written.read_text())
    assert result["via"] == "facade" and result["frames_sent"] > 0 and result["commit"] == git_head()


def test_every_result_file_is_named_by_what_it_measures_the_hardware_and_the_commit():
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert files
    misnamed = [str(p.relative_to(RESULTS)) for p in files if not RESULT_NAME.match(p.name)]
    assert misnamed == []


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "bench" / "notes").glob("*.md")),
            *sorted((ROOT / "docs").glob("*.md"))]  # fmt: skip


def expand_braces(name: str) -> list[str]:
    """``a-{x,y}-b`` -> ``a-x-b``, ``a-y-b`` (the shorthand the documents use for a set of result files)."""
    match = re.search(r"\{([^{}]*)\}", name)
    if match is None:
        return [name]
    return [
        n
        for part in match.group(1).split(",")
        for n in expand_braces(name[: match.start()] + part + name[match.end() :])
    ]


def named_results(doc: Path) -> set[str]:
    """The result files a document names: every backticked path under ``results/``, and in bench/README.md (whose
    table names them relative to bench/results/) every backticked result file name."""
    names = set()
    for token in re.findall(r"`([^`\s]+\.(?:json|jsonl\.gz))`", doc.read_text()):
        relative = re.sub(r"^(?:bench/)?results/", "", token)
        if "<" not in token and (relative != token or (doc.parent.name == "bench" and not token.startswith("."))):
            names.update(expand_braces(relative))
    return names


def test_every_result_a_document_names_exists():
    named = {(doc.relative_to(ROOT).as_posix(), name) for doc in documents() for name in named_results(doc)}
    assert any(doc == "README.md" for doc, _ in named), "README.md's Measured table names its result files"
    assert any(doc == "bench/README.md" for doc, _ in named), "bench/README.md names each benchmark's result"
    missing = sorted((doc, name) for doc, name in named if not (RESULTS / name).is_file())
    assert missing == []


def test_bench_readme_names_every_result_file():
    named = named_results(ROOT / "bench" / "README.md")
    kept = {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file()}
    # The side by side's reference half is named as the .reference.json of its file.
    unnamed = sorted(k for k in kept - named if not k.endswith(".reference.json"))
    assert unnamed == []


def test_no_file_name_or_note_heading_is_a_sequence_number():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert [name for name in tracked.splitlines() if SEQUENCE_NAME.search(name)] == []
    headings = [
        (doc.name, line)
        for doc in documents()
        for line in doc.read_text().splitlines()
        if line.startswith("#") and SEQUENCE_NAME.search(line)
    ]
    assert headings == []
