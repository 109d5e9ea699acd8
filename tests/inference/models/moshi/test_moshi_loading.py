"""Checkpoint directory reading and strict LM loading: every bad input gives a CheckpointError naming it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from inference.models.moshi.config import CheckpointError, LMConfig, read_checkpoint_dir
from inference.models.moshi.loading import load_lm
from inference.models.moshi.make_checkpoint import random_lm_state_dict
from tests.inference.models.moshi.moshi_lm_helpers import make_lm_dir


@pytest.fixture
def ckpt(tmp_path):
    return make_lm_dir(tmp_path / "ckpt", seed=5, context=32)


def test_loads_and_keys_are_the_published_fused_names(ckpt):
    info = read_checkpoint_dir(ckpt)
    lm = load_lm(info.moshi_weights, info.lm)
    keys = set(lm.state_dict())
    assert "transformer.layers.0.self_attn.in_proj_weight" in keys
    assert "depformer.layers.1.gating.7.linear_in.weight" in keys
    assert lm.state_dict()["depformer.layers.0.self_attn.in_proj_weight"].shape == (8 * 3 * 32, 32)
    assert info.demo_weights is True and info.lm_gen_config["top_k_text"] == 25


def test_missing_key_is_named(ckpt):
    state = load_file(str(ckpt / "model.safetensors"))
    del state["depformer.layers.1.gating.3.linear_out.weight"]
    save_file(state, str(ckpt / "model.safetensors"))
    info = read_checkpoint_dir(ckpt)
    with pytest.raises(CheckpointError, match=r"missing key 'depformer\.layers\.1\.gating\.3\.linear_out\.weight'"):
        load_lm(info.moshi_weights, info.lm)


def test_unexpected_key_is_named(ckpt):
    state = load_file(str(ckpt / "model.safetensors"))
    state["linears.99.weight"] = torch.zeros(2, 2)
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"unexpected key 'linears\.99\.weight'"):
        load_lm(ckpt / "model.safetensors", read_checkpoint_dir(ckpt).lm)


def test_wrong_shape_is_named(ckpt):
    state = load_file(str(ckpt / "model.safetensors"))
    state["emb.3.weight"] = state["emb.3.weight"][:-1]
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'emb\.3\.weight' has shape \(2048, 64\), expected \(2049, 64\)"):
        load_lm(ckpt / "model.safetensors", read_checkpoint_dir(ckpt).lm)


def test_truncated_file(ckpt):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_lm(path, read_checkpoint_dir(ckpt).lm)
    path.write_bytes(b"\x10")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_lm(path, read_checkpoint_dir(ckpt).lm)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.update(frobnicate=1), "unsupported LM argument 'frobnicate'"),
        (lambda c: c.update(delays=[0, 1]), "expected 17 delays"),
        (lambda c: c.update(dim=65), "not divisible"),
        (lambda c: c.update(norm="layer_norm"), "unsupported norm"),
        (lambda c: c.update(extra_heads_num_heads=2), "extra_heads_num_heads=2 is not supported"),
        (lambda c: c.update(causal=False), "causal=False is not supported"),
        (lambda c: c.update(moshi_name="nope.safetensors"), "nope.safetensors does not exist"),
        (lambda c: c.update(moshi_name="hf://kyutai/x/model.safetensors"), "not a local file name"),
        (lambda c: c.update(lm_gen_config=[1]), "lm_gen_config must be an object"),
    ],
)
def test_bad_config_json(ckpt, edit, message):
    config = json.loads((ckpt / "config.json").read_text())
    edit(config)
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint_dir(ckpt)


def test_malformed_config_and_missing_dir(ckpt, tmp_path):
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not readable JSON"):
        read_checkpoint_dir(ckpt)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint_dir(tmp_path / "absent")


def test_directory_without_config_is_moshiko_7b(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    info = read_checkpoint_dir(tmp_path)
    assert info.lm == LMConfig.moshiko_7b()
    assert info.lm.dim == 4096 and info.lm.dep_q == 8 and info.lm.context == 3000
    assert info.mimi_weights.name == "tokenizer-e351c8d8-checkpoint125.safetensors"
    assert info.tokenizer.name == "tokenizer_spm_32k_3.model"
    assert info.mimi_config is None and info.demo_weights is False


def test_personaplex_config_widens_a_dep_q8_file(ckpt, tmp_path):
    """A Moshiko (dep_q 8) file initialises a dep_q 16 model: steps k+8 copy steps k, as PersonaPlex's loader."""
    info8 = read_checkpoint_dir(ckpt)
    config16 = LMConfig.from_lm_kwargs(_lm_kwargs(ckpt, dep_q=16))
    lm16 = load_lm(info8.moshi_weights, config16)
    state8 = load_file(str(ckpt / "model.safetensors"))
    sd = lm16.state_dict()
    fused = sd["depformer.layers.0.self_attn.in_proj_weight"]
    assert fused.shape == (16 * 3 * 32, 32)
    assert torch.equal(fused[8 * 96 :], state8["depformer.layers.0.self_attn.in_proj_weight"])
    assert torch.equal(sd["linears.11.weight"], state8["linears.3.weight"])
    assert torch.equal(
        sd["depformer.layers.1.gating.15.linear_in.weight"], state8["depformer.layers.1.gating.7.linear_in.weight"]
    )
    assert torch.equal(sd["depformer_emb.9.weight"], state8["depformer_emb.1.weight"])
    assert not sd["depformer_emb.7.weight"].any()  # no counterpart in an 8-step file


def test_random_weights_are_a_function_of_the_seed():
    config = LMConfig.from_lm_kwargs(_kwargs_tiny())
    a, b, c = random_lm_state_dict(config, 1), random_lm_state_dict(config, 1), random_lm_state_dict(config, 2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["emb.0.weight"], c["emb.0.weight"])
    assert abs(float(a["out_norm.alpha"].mean()) - 1.0) < 0.1


def _kwargs_tiny() -> dict:
    from inference.models.moshi.make_checkpoint import PRESETS

    return dict(PRESETS["tiny-moshiko"])


def _lm_kwargs(ckpt, **overrides) -> dict:
    raw = json.loads((ckpt / "config.json").read_text())
    for key in ("moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name", "model_type", "lm_gen_config"):
        raw.pop(key, None)
    raw.pop("parley_demo", None)
    raw.update(overrides)
    return raw
