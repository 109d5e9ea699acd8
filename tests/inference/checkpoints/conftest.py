"""Tiny checkpoints of the three families, written once per session by the project's own makers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.fixture(scope="session")
def tiny_moshi(tmp_path_factory) -> Path:
    from inference.models.moshi.make_checkpoint import make_checkpoint

    return make_checkpoint("tiny-moshiko", tmp_path_factory.mktemp("moshi"), seed=0)


@pytest.fixture(scope="session")
def tiny_personaplex(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("personaplex") / "ckpt"
    shutil.copytree(DATA / "personaplex" / "ckpt", out)
    (out / "voices").mkdir()
    shutil.copy(DATA / "personaplex" / "voice_prompt.safetensors", out / "voices" / "NATF0.safetensors")
    return out


@pytest.fixture(scope="session")
def tiny_minicpmo(tmp_path_factory) -> Path:
    from inference.models.minicpmo.fill import make_checkpoint
    from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets
    from inference.models.minicpmo.vocoder import ASSET_SUBDIR

    out = make_checkpoint(tmp_path_factory.mktemp("minicpmo") / "ckpt", data_dir=DATA / "minicpmo45", seed=1234)
    make_token2wav_assets(out / ASSET_SUBDIR, seed=1234)
    return out


def copy_of(source: Path, tmp_path: Path) -> Path:
    """A private copy to break (the session's tiny checkpoints stay intact)."""
    return Path(shutil.copytree(source, tmp_path / source.name))
