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

from inference.models.moshi.config import read_checkpoint_dir
from inference.models.moshi.mimi_config import MimiConfig
from inference.models.moshi.mimi_loading import load_mimi
from inference.models.moshi.replay import replay
from tests.inference.models.moshi.moshi_lm_helpers import ROOT, run_reference, user_codes


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


def _replay_cli(*args: str):
    cmd = [sys.executable, "-m", "inference", "replay", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_replay_cli_user_audio_and_errors(moshiko, tmp_path):
    import soundfile

    rng = np.random.default_rng(1)
    pcm = (0.1 * rng.standard_normal(1920 * 12)).astype(np.float32)
    wav = tmp_path / "user.wav"
    soundfile.write(wav, pcm, 24000, subtype="FLOAT")
    out = tmp_path / "out.npy"
    done = _replay_cli("--checkpoint", str(moshiko), "--user-audio", str(wav), "--out", str(out), "--greedy")
    assert done.returncode == 0, done.stdout + done.stderr
    info = read_checkpoint_dir(moshiko)
    codec = load_mimi(info.mimi_weights, MimiConfig.from_dict(info.mimi_config))
    codes = codec.encode(torch.from_numpy(pcm).view(1, 1, -1))[0].numpy()
    np.testing.assert_array_equal(np.load(out), replay(info, codes, greedy=True))
    # bfloat16 runs and gives tokens in range (bit parity is only claimed for float32)
    codes_path = tmp_path / "codes.npy"
    np.save(codes_path, codes)
    done = _replay_cli("--checkpoint", str(moshiko), "--user-codes", str(codes_path), "--out", str(out),
                       "--dtype", "bfloat16")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert np.load(out).shape == (11, 9)
    # malformed inputs: a clear message and exit code 2, never a traceback
    np.save(codes_path, np.full((8, 5), 4096, dtype=np.int64))
    persona = tmp_path / "persona.txt"
    persona.write_text("hello")
    good = tmp_path / "good.npy"
    np.save(good, codes)
    bad_pickle = tmp_path / "bad.npy"
    bad_pickle.write_bytes(b"garbage")
    for args, message in [
        (["--user-codes", str(codes_path)], "must be in 0..2047"),
        (["--user-codes", str(good), "--persona-file", str(persona)], "need a PersonaPlex checkpoint"),
        (["--user-codes", str(bad_pickle)], "not a readable .npy"),
        (["--user-codes", str(codes_path), "--persona-file", str(wav)], "not a readable text file"),
        (["--user-codes", str(bad_pickle), "--voice-prompt", str(wav)], "not a readable .npy"),
    ]:
        done = _replay_cli("--checkpoint", str(moshiko), *args, "--out", str(out))
        assert done.returncode == 2 and message in done.stdout, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
