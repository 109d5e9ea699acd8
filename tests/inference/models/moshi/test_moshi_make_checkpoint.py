"""``python -m inference make-checkpoint``: a complete, loadable tiny checkpoint in the published layout."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import sentencepiece as spm
import torch
from moshi_lm_helpers import ROOT, run_reference, user_codes

from inference.models.moshi.config import read_checkpoint_dir
from inference.models.moshi.mimi import MimiConfig, load_mimi
from inference.models.moshi.replay import replay


def make(preset: str, out, seed: int):
    cmd = [sys.executable, "-m", "inference", "make-checkpoint", "--preset", preset, "--out", str(out)]
    done = subprocess.run(cmd + ["--seed", str(seed)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "RANDOM demo weights" in done.stdout
    return out


@pytest.fixture(scope="module")
def moshiko(tmp_path_factory):
    return make("tiny-moshiko", tmp_path_factory.mktemp("ckpt") / "moshiko", 4)


def test_layout_config_tokenizer_and_mimi(moshiko):
    names = sorted(p.name for p in moshiko.iterdir())
    assert names == ["config.json", "mimi.safetensors", "mimi_config.json", "model.safetensors", "tokenizer.model"]
    raw = json.loads((moshiko / "config.json").read_text())
    assert raw["parley_demo"] is True and raw["dep_q"] == 8 and raw["moshi_name"] == "model.safetensors"
    info = read_checkpoint_dir(moshiko)
    assert info.demo_weights
    tok = spm.SentencePieceProcessor(model_file=str(info.tokenizer))
    assert tok.get_piece_size() <= info.lm.text_card
    assert [tok.id_to_piece(i) for i in range(4)] == ["<unk>", "<s>", "</s>", "<pad>"]
    codec = load_mimi(info.mimi_weights, MimiConfig.from_dict(info.mimi_config), num_codebooks=8)
    pcm = torch.randn(1, 1, 1920 * 3) * 0.1
    codes = codec.encode(pcm)
    assert codes.shape == (1, 8, 3) and int(codes.max()) < info.lm.card


@pytest.mark.reference
def test_reference_moshi_loads_it_and_agrees(moshiko, tmp_path):
    codes = user_codes(4, (8, 30))
    expected = run_reference(moshiko, codes, tmp_path)
    np.testing.assert_array_equal(replay(read_checkpoint_dir(moshiko), codes, greedy=True), expected)


def test_seed_determinism_and_personaplex_preset(moshiko, tmp_path):
    again = make("tiny-moshiko", tmp_path / "again", 4)
    other = make("tiny-personaplex", tmp_path / "pp", 5)

    def digest(path):
        return hashlib.sha256(path.read_bytes()).hexdigest()

    assert digest(again / "model.safetensors") == digest(moshiko / "model.safetensors")
    assert digest(again / "tokenizer.model") == digest(moshiko / "tokenizer.model")
    info = read_checkpoint_dir(other)
    assert info.lm.dep_q == 16 and info.lm.personaplex
    assert digest(other / "model.safetensors") != digest(moshiko / "model.safetensors")


def test_unknown_preset_is_refused(tmp_path):
    cmd = [sys.executable, "-m", "inference", "make-checkpoint", "--preset", "huge", "--out", str(tmp_path / "x")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "invalid choice" in done.stderr
