"""The deterministic fill reproduces the golden weights; loading is strict and names the offending key."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from inference.models.minicpmo.config import CheckpointError, MiniCPMOConfig
from inference.models.minicpmo.fill import fill_tensor, is_norm_weight, read_keys
from inference.models.minicpmo.loading import load_model


def test_generated_weights_hash_matches_the_golden_pack(minicpmo_checkpoint, minicpmo_data_dir):
    golden = json.loads((minicpmo_data_dir / "audio8" / "golden.json").read_text())
    digest = hashlib.sha256((minicpmo_checkpoint / "model.safetensors").read_bytes()).hexdigest()
    assert digest == golden["weights"]["model_safetensors_sha256"]


def test_fill_follows_the_formula_for_single_elements():
    # Element i = 1 of a named tensor, computed by hand from the README's formula.
    import zlib

    name, seed = "apm.conv1.bias", 1234
    h = (zlib.crc32(name.encode()) + seed) % 2**32
    v = (1 * 2654435761 + h) % 2**32
    v ^= v >> 16
    v = (v * 0x45D9F3B) % 2**32
    v ^= v >> 16
    x = np.float32((v / 2**32 - 0.5) * np.sqrt(12.0))
    assert fill_tensor(name, (32,), seed)[0] == np.float32(0.05) * x
    assert fill_tensor("llm.model.norm.weight", (4,), seed)[0] != fill_tensor("llm.model.norm.weight", (4,), 1)[0]


@pytest.mark.parametrize(
    ("name", "norm"),
    [
        ("llm.model.norm.weight", True),
        ("apm.layers.0.self_attn_layer_norm.weight", True),
        ("resampler.ln_q.weight", True),
        ("resampler.ln_q.bias", False),
        ("llm.model.layers.0.self_attn.q_norm.weight", True),
        ("llm.lm_head.weight", False),
        ("resampler.proj", False),
    ],
)
def test_norm_weight_rule(name, norm):
    assert is_norm_weight(name) is norm


def test_keys_file_lists_every_tensor_of_the_architecture(minicpmo_data_dir):
    from inference.models.minicpmo.loading import build_parts, expected_shapes

    parts = build_parts(MiniCPMOConfig.from_dir(minicpmo_data_dir))
    assert expected_shapes(parts) == dict(read_keys(minicpmo_data_dir / "keys.txt"))


def _copy_checkpoint(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_tensor_is_named(minicpmo_checkpoint, tmp_path):
    ckpt = _copy_checkpoint(minicpmo_checkpoint, tmp_path / "ckpt")
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["tts.projector_semantic.linear2.bias"]
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"tts\.projector_semantic\.linear2\.bias"):
        load_model(ckpt)


def test_wrong_shape_and_unexpected_tensor_are_named(minicpmo_checkpoint, tmp_path):
    ckpt = _copy_checkpoint(minicpmo_checkpoint, tmp_path / "ckpt")
    tensors = load_file(ckpt / "model.safetensors")
    tensors["resampler.query"] = np.zeros((63, 128), np.float32)
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"resampler\.query.*\(63, 128\)"):
        load_model(ckpt)
    tensors["resampler.query"] = np.zeros((64, 128), np.float32)
    tensors["vpm.encoder.layers.1.layer_norm1.bias"] = np.zeros(32, np.float32)
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'vpm\.encoder\.layers\.1\.layer_norm1\.bias'"):
        load_model(ckpt)


def test_sharded_checkpoint_loads_the_same_weights(minicpmo_checkpoint, minicpmo_parts, tmp_path):
    ckpt = tmp_path / "sharded"
    ckpt.mkdir()
    for f in minicpmo_checkpoint.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, ckpt / f.name)
    tensors = load_file(minicpmo_checkpoint / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for fname, part in shards.items():
        save_file({n: tensors[n] for n in part}, ckpt / fname)
        weight_map.update(dict.fromkeys(part, fname))
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    parts = load_model(ckpt)
    a = parts.llm.llm.lm_head.weight
    assert torch.equal(a, minicpmo_parts.llm.llm.lm_head.weight)
    assert torch.equal(parts.tts.head_code[0].weight, minicpmo_parts.tts.head_code[0].weight)
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        load_model(ckpt)


def test_broken_config_and_missing_files_are_typed_errors(minicpmo_checkpoint, tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_model(tmp_path / "nowhere")
    ckpt = _copy_checkpoint(minicpmo_checkpoint, tmp_path / "ckpt")
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["audio_config"]["d_model"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"audio_config\.'d_model'"):
        MiniCPMOConfig.from_dir(ckpt)
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="invalid JSON"):
        load_model(ckpt)
    shutil.copy(minicpmo_checkpoint / "config.json", ckpt / "config.json")
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(ckpt)


def test_make_checkpoint_command(minicpmo_checkpoint, tmp_path, capsys):
    from inference.__main__ import main as inference_main

    out = tmp_path / "cli-ckpt"
    assert inference_main(["make-minicpmo-checkpoint", "--out", str(out), "--seed", "7"]) == 0
    names = sorted(p.name for p in out.iterdir() if p.name != "assets")
    assert names == sorted(p.name for p in minicpmo_checkpoint.iterdir())
    assert (out / "assets" / "token2wav" / "flow.yaml").is_file()  # the demo checkpoint speaks (random assets)
    a = load_file(out / "model.safetensors")["resampler.query"]
    b = load_file(minicpmo_checkpoint / "model.safetensors")["resampler.query"]
    assert a.shape == b.shape and not np.array_equal(a, b)  # another seed, other weights
    assert inference_main(["make-minicpmo-checkpoint", "--out", str(tmp_path / "x"), "--data-dir", str(tmp_path)]) == 2
    assert "missing config.json" in capsys.readouterr().out


def test_vocoder_falls_back_to_silence_of_the_right_length(minicpmo_checkpoint, tmp_path):
    from inference.models.minicpmo.token2wav.config import AssetError
    from inference.models.minicpmo.vocoder import SilentVocoder, build_vocoder, vocoder_kind

    assert vocoder_kind(minicpmo_checkpoint, "cpu") == "none"  # no assets configured: silence
    assert isinstance(build_vocoder(minicpmo_checkpoint, "cpu"), SilentVocoder)
    (tmp_path / "assets" / "token2wav").mkdir(parents=True)
    assert vocoder_kind(tmp_path, "cpu") == "token2wav"  # configured assets are used, on CPU too
    with pytest.raises(AssetError, match="flow.yaml"):  # ... and bad ones are an error, not silence
        build_vocoder(tmp_path, "cpu")
    voc = SilentVocoder()
    audio = voc.synthesize(voc.new_state(None), list(range(25)), end_of_turn=False)
    assert audio.shape == (24000,) and audio.dtype == np.float32 and not audio.any()
    assert voc.synthesize(voc.new_state(None), [], end_of_turn=True).shape == (0,)
