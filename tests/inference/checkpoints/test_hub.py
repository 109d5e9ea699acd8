"""Hub repository ids resolved with no network: a hub cache laid out as huggingface_hub lays it out
(``models--org--name/{blobs,refs,snapshots}``), populated with the tiny checkpoints, read offline."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inference.checkpoints.hub import HubError, is_hub_id, resolve_checkpoint, split_id
from inference.checkpoints.resolve import resolve_config
from inference.config import HubAccess, InferenceConfig

ROOT = Path(__file__).resolve().parents[3]
COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


def add_snapshot(cache: Path, repo: str, source: Path, commit: str, ref: str | None = "main") -> Path:
    """``source``'s files as snapshot ``commit`` of ``repo``: content-addressed blobs, symlinked, ``refs/<ref>``."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref:
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, tiny_moshi, tiny_personaplex, tiny_minicpmo) -> Path:
    cache = tmp_path_factory.mktemp("hf") / "hub"
    add_snapshot(cache, "kyutai/moshiko-pytorch-bf16", tiny_moshi, COMMIT_A)
    add_snapshot(cache, "nvidia/personaplex-7b-v1", tiny_personaplex, COMMIT_A)
    add_snapshot(cache, "openbmb/MiniCPM-o-4_5", tiny_minicpmo, COMMIT_A)
    return cache


def offline(cache: Path) -> HubAccess:
    return HubAccess(offline=True, cache_dir=cache)


def test_ids_are_told_from_folders(tmp_path, monkeypatch):
    assert is_hub_id("kyutai/moshiko-pytorch-bf16") and is_hub_id("nvidia/personaplex-7b-v1@v1.0")
    assert split_id("openbmb/MiniCPM-o-4_5@" + COMMIT_B) == ("openbmb/MiniCPM-o-4_5", COMMIT_B)
    assert not is_hub_id("/models/moshi") and not is_hub_id("models")
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not is_hub_id("org/name")  # an existing relative folder is a folder


@pytest.mark.parametrize(
    ("repo", "family"),
    [("kyutai/moshiko-pytorch-bf16", "moshi"), ("nvidia/personaplex-7b-v1", "personaplex"),
     ("openbmb/MiniCPM-o-4_5", "minicpmo")],
)  # fmt: skip
def test_each_family_resolves_from_the_cache_and_its_engine_is_inferred(hub_cache, repo, family):
    folder = resolve_checkpoint(repo, offline(hub_cache))
    assert folder == hub_cache / ("models--" + repo.replace("/", "--")) / "snapshots" / COMMIT_A
    config = InferenceConfig.from_env({"PARLEY_CHECKPOINT": repo})
    assert config.engine == "auto"
    resolved = resolve_config(config, offline(hub_cache))
    assert (resolved.engine, resolved.checkpoint) == (family, folder)
    # an explicit PARLEY_ENGINE is kept
    assert InferenceConfig.from_env({"PARLEY_CHECKPOINT": repo, "PARLEY_ENGINE": "echo"}).engine == "echo"


def test_a_pinned_revision_picks_its_snapshot(hub_cache, tiny_moshi, tmp_path):
    cache = tmp_path / "hub"
    shutil.copytree(hub_cache / "models--kyutai--moshiko-pytorch-bf16", cache / "models--kyutai--moshiko-pytorch-bf16",
                    symlinks=True)  # fmt: skip
    add_snapshot(cache, "kyutai/moshiko-pytorch-bf16", tiny_moshi, COMMIT_B, ref="v2")
    repo = "kyutai/moshiko-pytorch-bf16"
    assert resolve_checkpoint(repo, offline(cache)).name == COMMIT_A  # refs/main
    assert resolve_checkpoint(f"{repo}@v2", offline(cache)).name == COMMIT_B  # a tag
    assert resolve_checkpoint(f"{repo}@{COMMIT_B}", offline(cache)).name == COMMIT_B  # a commit
    with pytest.raises(HubError, match="v3 is not in the hub cache .* HF_HUB_OFFLINE is set"):
        resolve_checkpoint(f"{repo}@v3", offline(cache))


def test_offline_and_not_cached_is_a_clear_error(hub_cache):
    with pytest.raises(HubError, match=r"kyutai/moshika-pytorch-bf16@main is not in the hub cache"):
        resolve_checkpoint("kyutai/moshika-pytorch-bf16", offline(hub_cache))


def test_a_missing_file_is_named(hub_cache, tmp_path):
    cache = tmp_path / "hub"
    shutil.copytree(hub_cache, cache, symlinks=True)
    snapshot = cache / "models--nvidia--personaplex-7b-v1" / "snapshots" / COMMIT_A
    (snapshot / "tokenizer.model").unlink()
    with pytest.raises(HubError, match=r"nvidia/personaplex-7b-v1@main: tokenizer.model is missing from the cache"):
        resolve_checkpoint("nvidia/personaplex-7b-v1", offline(cache))
    mc = cache / "models--openbmb--MiniCPM-o-4_5" / "snapshots" / COMMIT_A
    (mc / "model.safetensors").unlink()
    with pytest.raises(HubError, match=r"model.safetensors is missing"):
        resolve_checkpoint("openbmb/MiniCPM-o-4_5", offline(cache))


def test_the_environment_is_honoured(hub_cache, monkeypatch):
    access = HubAccess.from_env({"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache), "HF_TOKEN": "hf_x"})
    assert access == HubAccess(token="hf_x", offline=True, cache_dir=hub_cache)
    assert "hf_x" not in repr(access)
    assert HubAccess.from_env({"HF_HOME": "/h"}).cache_dir == Path("/h/hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    assert resolve_checkpoint("openbmb/MiniCPM-o-4_5").name == COMMIT_A


def test_build_engine_serves_a_hub_id(hub_cache, monkeypatch):
    from inference.engines import build_engine
    from inference.engines.lockstep import LockstepEngine
    from inference.errors import EngineNotAvailable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    engine = build_engine(
        InferenceConfig.from_env({"PARLEY_CHECKPOINT": "nvidia/personaplex-7b-v1", "PARLEY_SLOTS": "1"})
    )
    assert isinstance(engine, LockstepEngine)
    assert engine.info.directory == hub_cache / "models--nvidia--personaplex-7b-v1" / "snapshots" / COMMIT_A
    assert engine.info.lm.personaplex
    with pytest.raises(EngineNotAvailable, match="nvidia/personaplex-7b-v2.*not in the hub cache"):
        build_engine(InferenceConfig.from_env({"PARLEY_CHECKPOINT": "nvidia/personaplex-7b-v2"}))


def test_doctor_on_a_hub_id(hub_cache):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache)}
    run = subprocess.run([sys.executable, "-m", "inference", "doctor", "nvidia/personaplex-7b-v1", "--gpu-gb", "24"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"snapshots/{COMMIT_A}" in run.stdout and "family      personaplex" in run.stdout
    assert "PARLEY_CHECKPOINT=nvidia/personaplex-7b-v1 " in run.stdout
    missing = subprocess.run([sys.executable, "-m", "inference", "doctor", "nvidia/nothing-here"],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)  # fmt: skip
    assert missing.returncode == 2 and "nvidia/nothing-here@main is not in the hub cache" in missing.stdout
