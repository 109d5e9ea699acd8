"""``python -m inference doctor``: the tiny checkpoint of each family diagnosed sound, broken copies diagnosed
by file and fault, all from headers (the weights are never read)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from inference.checkpoints.identify import inspect_checkpoint
from inference.checkpoints.safetensors_header import HeaderError, read_header
from tests.inference.checkpoints.conftest import DATA, copy_of

ROOT = Path(__file__).resolve().parents[3]


def doctor(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "inference", "doctor", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)  # fmt: skip


def problems(folder: Path) -> list[str]:
    return [str(f) for f in inspect_checkpoint(folder).findings]


# ---- sound checkpoints -------------------------------------------------------------------------------------


def test_doctor_moshi(tiny_moshi):
    run = doctor(str(tiny_moshi), "--gpu-gb", "24")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "family      moshi" in out and "dep_q 8" in out
    assert "every tensor name, shape and dtype matches" in out
    assert "SentencePiece, 256 pieces" in out and "Mimi (kyutai layout" in out
    assert "PARLEY_ENGINE=moshi" in out and f"PARLEY_CHECKPOINT={tiny_moshi}" in out


def test_doctor_personaplex_finds_voice_prompts(tiny_personaplex):
    run = doctor(str(tiny_personaplex), "--gpu-gb", "24")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "family      personaplex" in run.stdout and "dep_q 16" in run.stdout
    assert "voices      1 found: voices/NATF0.safetensors" in run.stdout
    assert "PARLEY_ENGINE=personaplex" in run.stdout and "PARLEY_KV_PAGE_FRAMES=128" in run.stdout


def test_doctor_minicpmo(tiny_minicpmo):
    run = doctor(str(tiny_minicpmo), "--gpu-gb", "80")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "family      minicpmo" in out and "every tensor name, shape and dtype matches" in out
    assert "151643 + 105 added tokens" in out and "Token2Wav assets in assets/token2wav" in out
    assert "PARLEY_ENGINE=minicpmo" in out


def test_header_reader_never_reads_the_data(tiny_personaplex, tmp_path):
    # the data region replaced by zeros of the same length: the header alone still describes every tensor
    source = tiny_personaplex / "model.safetensors"
    blob = source.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    blank = tmp_path / "blank.safetensors"
    blank.write_bytes(blob[: 8 + length] + bytes(len(blob) - 8 - length))
    assert {k: v.shape for k, v in read_header(blank).items()} == {
        k: tuple(v.shape) for k, v in load_file(source).items()
    }


# ---- broken copies -----------------------------------------------------------------------------------------


def _shard(folder: Path) -> None:
    """Split model.safetensors into two shards listed by model.safetensors.index.json, as the hub ships it."""
    tensors = load_file(folder / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(folder / shard))
    index = {"metadata": {}, "weight_map": {n: s for s, part in shards.items() for n in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model.safetensors").unlink()


def test_sharded_copy_is_sound_and_a_missing_shard_is_named(tiny_minicpmo, tmp_path):
    folder = copy_of(tiny_minicpmo, tmp_path)
    _shard(folder)
    assert problems(folder) == []
    (folder / "model-00002-of-00002.safetensors").unlink()
    found = problems(folder)
    assert len(found) == 1, found
    assert found[0].startswith(
        "model-00002-of-00002.safetensors: shard listed by model.safetensors.index.json is missing"
    )
    run = doctor(str(folder), "--gpu-gb", "80")
    assert run.returncode == 1 and "model-00002-of-00002.safetensors: shard listed" in run.stdout


def test_wrong_shape_is_named(tiny_personaplex, tmp_path):
    import torch

    folder = copy_of(tiny_personaplex, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["text_emb.weight"] = torch.zeros(
        tensors["text_emb.weight"].shape[0] + 1, tensors["text_emb.weight"].shape[1]
    )
    save_file(tensors, str(folder / "model.safetensors"))
    assert problems(folder) == ["model.safetensors: tensor 'text_emb.weight' has shape (258, 64), expected (257, 64)"]


def test_missing_and_integer_tensors_are_named(tiny_moshi, tmp_path):
    import torch

    folder = copy_of(tiny_moshi, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["out_norm.alpha"]
    tensors["text_linear.weight"] = tensors["text_linear.weight"].to(torch.int32)
    save_file(tensors, str(folder / "model.safetensors"))
    found = problems(folder)
    assert any(f.startswith("model.safetensors: missing tensor 'out_norm.alpha'") for f in found), found
    assert "model.safetensors: tensor 'text_linear.weight' has dtype I32, expected a float" in found


def test_truncated_header_is_named(tiny_personaplex, tmp_path):
    folder = copy_of(tiny_personaplex, tmp_path)
    weights = folder / "model.safetensors"
    blob = weights.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    weights.write_bytes(blob[: 8 + length // 2])
    found = problems(folder)
    assert len(found) == 1 and found[0].startswith(f"model.safetensors: header says {length} bytes of JSON"), found
    assert "truncated" in found[0]
    with pytest.raises(HeaderError, match="too short"):
        weights.write_bytes(blob[:5])
        read_header(weights)


def test_partial_download_is_named(tiny_personaplex, tmp_path):
    folder = copy_of(tiny_personaplex, tmp_path)
    mimi = folder / "mimi.safetensors"
    mimi.write_bytes(mimi.read_bytes()[:-1000])  # the header intact, the data cut short
    found = problems(folder)
    assert len(found) == 1 and found[0].startswith("mimi.safetensors: tensor "), found
    assert "truncated: a partial download?" in found[0]


def test_foreign_tokenizers_are_named(tiny_moshi, tmp_path):
    from inference.models.moshi.make_checkpoint import train_tokenizer

    folder = copy_of(tiny_moshi, tmp_path)
    (folder / "tokenizer.model").write_bytes((DATA / "minicpmo45" / "tokenizer" / "vocab.json").read_bytes())
    found = problems(folder)
    assert len(found) == 1 and found[0].startswith("tokenizer.model: not a SentencePiece model"), found
    train_tokenizer(folder / "tokenizer.model", 200, seed=3)  # a SentencePiece model of another vocabulary
    assert problems(folder) == [
        "tokenizer.model: SentencePiece model has 200 pieces but the model's text_card is 256 "
        "(a tokenizer from another model?)"
    ]


def test_foreign_tokenizer_for_minicpmo_is_named(tiny_minicpmo, tmp_path):
    folder = copy_of(tiny_minicpmo, tmp_path)
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["<|foreign|>"] = 200000  # a larger vocabulary than the model's embedding
    (folder / "vocab.json").write_text(json.dumps(vocab))
    assert problems(folder) == [
        "vocab.json: token id 200000 is past the model's vocab_size 151748 (a tokenizer from another model?)"
    ]


def test_missing_codec_and_not_a_checkpoint(tiny_moshi, tmp_path):
    folder = copy_of(tiny_moshi, tmp_path)
    (folder / "mimi.safetensors").unlink()
    assert problems(folder) == ["mimi.safetensors: Mimi codec weights are missing"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert problems(empty) == ["empty: neither config.json nor model.safetensors: not a checkpoint folder"]
    run = doctor(str(tmp_path / "nowhere"))
    assert run.returncode == 2 and "no such folder" in run.stdout
