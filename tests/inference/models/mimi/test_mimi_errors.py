"""Malformed checkpoints, configs and inputs get typed errors that name the key, file or argument."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from inference.models.moshi.mimi import MimiCodec, MimiInputError
from inference.models.moshi.mimi_config import MimiConfig, MimiConfigError
from inference.models.moshi.mimi_loading import MimiLoadError, load_mimi

DATA = Path(__file__).resolve().parents[4] / "tests" / "data" / "personaplex"
FRAME = 1920
SOME_KEY = "decoder_transformer.transformer.layers.1.linear2.weight"


@pytest.fixture(scope="module")
def golden_state() -> dict[str, torch.Tensor]:
    return load_file(str(DATA / "ckpt" / "mimi.safetensors"))


def save(tmp_path: Path, state: dict[str, torch.Tensor], name: str = "mimi.safetensors") -> Path:
    path = tmp_path / name
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


# --- checkpoints ------------------------------------------------------------------------------------------------


def test_missing_key_is_named(tmp_path, golden_state, tiny_config):
    state = dict(golden_state)
    del state[SOME_KEY]
    with pytest.raises(MimiLoadError, match=rf"missing key '{SOME_KEY}'") as info:
        load_mimi(save(tmp_path, state), tiny_config)
    assert "mimi.safetensors" in str(info.value)


def test_wrong_shape_is_named_with_both_shapes(tmp_path, golden_state, tiny_config):
    state = dict(golden_state)
    state[SOME_KEY] = torch.zeros(64, 64)
    with pytest.raises(MimiLoadError, match=rf"'{SOME_KEY}' has shape \[64, 64\], the config expects \[64, 128\]"):
        load_mimi(save(tmp_path, state), tiny_config)


def test_unexpected_key_is_named(tmp_path, golden_state, tiny_config):
    state = dict(golden_state)
    state["encoder.model.99.conv.conv.weight"] = torch.zeros(1)
    with pytest.raises(MimiLoadError, match=r"unexpected key 'encoder.model.99.conv.conv.weight'"):
        load_mimi(save(tmp_path, state), tiny_config)


def test_integer_weights_are_refused(tmp_path, golden_state, tiny_config):
    state = dict(golden_state)
    state[SOME_KEY] = torch.zeros(64, 128, dtype=torch.int32)
    with pytest.raises(MimiLoadError, match=rf"'{SOME_KEY}' has dtype torch.int32"):
        load_mimi(save(tmp_path, state), tiny_config)


def test_config_that_does_not_fit_the_file_names_the_first_mismatch(tiny_config):
    bigger = copy.deepcopy(tiny_config)
    bigger.transformer.dim_feedforward = 256
    with pytest.raises(MimiLoadError, match=r"linear1.weight' has shape \[128, 64\], the config expects \[256, 64\]"):
        load_mimi(DATA / "ckpt" / "mimi.safetensors", bigger)


def test_truncated_file_names_the_file(tmp_path, tiny_config):
    path = tmp_path / "truncated.safetensors"
    data = (DATA / "ckpt" / "mimi.safetensors").read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(MimiLoadError, match=r"truncated.safetensors.*not a readable safetensors file"):
        load_mimi(path, tiny_config)


def test_garbage_and_missing_files_name_the_file(tmp_path, tiny_config):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00\x01not safetensors at all")
    with pytest.raises(MimiLoadError, match="garbage.safetensors"):
        load_mimi(garbage, tiny_config)
    with pytest.raises(MimiLoadError, match=r"nowhere.safetensors' does not exist"):
        load_mimi(tmp_path / "nowhere.safetensors", tiny_config)
    with pytest.raises(MimiLoadError, match="is not a file"):
        load_mimi(tmp_path, tiny_config)


def test_unknown_layout_is_refused(tmp_path, tiny_config):
    path = save(tmp_path, {"model.layers.0.weight": torch.zeros(2)})
    with pytest.raises(MimiLoadError, match="unrecognised Mimi checkpoint layout"):
        load_mimi(path, tiny_config)


def test_transformers_layout_with_a_missing_projection_names_it(tmp_path, tiny_config, kyutai_to_hf):
    hf = kyutai_to_hf(load_file(str(DATA / "ckpt" / "mimi.safetensors")), tiny_config.transformer.num_heads)
    del hf["encoder_transformer.layers.1.self_attn.v_proj.weight"]
    with pytest.raises(MimiLoadError, match=r"encoder_transformer.transformer.layers.1.self_attn.v_proj.weight"):
        load_mimi(save(tmp_path, hf), tiny_config)


# --- configs ----------------------------------------------------------------------------------------------------


def golden_config_dict() -> dict:
    return json.loads((DATA / "ckpt" / "mimi_config.json").read_text())


def test_config_round_trips_and_knows_the_published_mimi():
    d = golden_config_dict()
    assert MimiConfig.from_dict(d).to_dict() == d
    assert MimiConfig.from_dict(d) == MimiConfig.tiny()
    full = MimiConfig.kyutai_default()
    assert (full.frame_size, full.resample_stride, full.seanet.hop_length) == (1920, 2, 960)
    assert (full.quantizer.n_q, full.quantizer.dimension, full.transformer.num_layers) == (32, 256, 8)
    assert MimiConfig.from_dict(full.to_dict()) == full


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.update(extra=1), r"unknown key\(s\) \['extra'\]"),
        (lambda d: d["seanet"].update(bogus=1), r"section 'seanet': unknown key\(s\) \['bogus'\]"),
        (lambda d: d.pop("quantizer"), r"missing section\(s\) \['quantizer'\]"),
        (lambda d: d.update(seanet=[1, 2]), "section 'seanet' must be an object"),
        (lambda d: d["seanet"].update(norm="weight_norm"), "seanet.norm 'weight_norm' is not supported"),
        (lambda d: d["seanet"].update(pad_mode="reflect"), "seanet.pad_mode 'reflect' is not supported"),
        (lambda d: d["seanet"].update(ratios="8654"), "seanet.ratios must be a non-empty list"),
        (lambda d: d["transformer"].update(num_heads=5), "d_model must divide by num_heads"),
        (lambda d: d["transformer"].update(norm="rms_norm"), "transformer.norm 'rms_norm' is not supported"),
        (lambda d: d["quantizer"].update(n_q=1), "n_q must exceed n_q_semantic"),
        (lambda d: d["quantizer"].update(bins="2048"), "quantizer.bins must be a positive integer"),
        (lambda d: d.update(frame_rate=11.0), "integer frame size"),
        (lambda d: d.update(channels=2), "only mono"),
        (lambda d: d["quantizer"].update(input_dimension=32), "input_dimension must equal seanet.dimension"),
    ],
)
def test_bad_configs_get_a_config_error(edit, match):
    d = golden_config_dict()
    edit(d)
    with pytest.raises(MimiConfigError, match=match):
        MimiConfig.from_dict(d)


def test_non_dict_config_is_refused():
    with pytest.raises(MimiConfigError, match="must be an object"):
        MimiConfig.from_dict([1, 2, 3])  # type: ignore[arg-type]


# --- inputs -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pcm", "match"),
    [
        (torch.zeros(2, 1, FRAME - 1), r"encode_step expects pcm of shape \[2, 1, 1920\]"),
        (torch.zeros(3, 1, FRAME), r"encode_step expects pcm of shape \[2, 1, 1920\]"),
        (torch.zeros(2, 1, FRAME, dtype=torch.int16), r"float tensor \[B, 1, T\]"),
        (torch.zeros(2, FRAME), r"float tensor \[B, 1, T\]"),
        (torch.zeros(2, 2, FRAME), r"float tensor \[B, 1, T\]"),
        ("not audio", r"float tensor \[B, 1, T\], got str"),
    ],
)
def test_bad_frames_get_an_input_error(golden_codec, pcm, match):
    state = golden_codec.init_stream(2)
    with pytest.raises(MimiInputError, match=match):
        golden_codec.encode_step(pcm, state)


@pytest.mark.parametrize(
    ("codes", "match"),
    [
        (torch.full((2, 8, 1), 2048), r"codes must lie in \[0, 2048\), found 2048"),
        (torch.full((2, 8, 1), -1), r"found -1"),
        (torch.zeros(2, 7, 1, dtype=torch.long), "K=8 codebooks"),
        (torch.zeros(2, 8, 2, dtype=torch.long), r"decode_step expects codes of shape \[2, 8, 1\]"),
        (torch.zeros(2, 8, 1), "integer tensor"),
        (torch.zeros(2, 8, 1, dtype=torch.bool), "got bool"),
    ],
)
def test_bad_codes_get_an_input_error(golden_codec, codes, match):
    state = golden_codec.init_stream(2)
    with pytest.raises(MimiInputError, match=match):
        golden_codec.decode_step(codes, state)


def test_bad_whole_clip_inputs_get_an_input_error(golden_codec):
    with pytest.raises(MimiInputError, match="at least one sample"):
        golden_codec.encode(torch.zeros(1, 1, 0))
    with pytest.raises(MimiInputError, match=r"found 4096"):
        golden_codec.decode(torch.full((1, 8, 3), 4096))
    with pytest.raises(MimiInputError, match="at least one frame"):
        golden_codec.decode(torch.zeros(1, 8, 0, dtype=torch.long))


def test_bad_stream_arguments_get_an_input_error(golden_codec):
    with pytest.raises(MimiInputError, match="batch_size"):
        golden_codec.init_stream(0)
    state = golden_codec.init_stream(2)
    with pytest.raises(MimiInputError, match=r"BoolTensor of shape \[2\]"):
        state.reset(torch.tensor([1, 0]))
    with pytest.raises(MimiInputError, match=r"BoolTensor of shape \[2\]"):
        state.reset(torch.tensor([True]))


def test_a_failed_call_leaves_the_stream_usable(golden_codec, test_audio):
    state = golden_codec.init_stream(2)
    with pytest.raises(MimiInputError):
        golden_codec.encode_step(torch.zeros(2, 1, 5), state)
    first = golden_codec.encode_step(test_audio[..., :FRAME], state)
    assert torch.equal(first, golden_codec.encode(test_audio[..., :FRAME]))


def test_codec_builds_for_the_published_config():
    with torch.device("meta"):
        codec = MimiCodec(MimiConfig.kyutai_default())
    params = sum(p.numel() for p in codec.parameters())
    assert 75e6 < params < 85e6  # about 79 M with all 32 codebooks (reference doc section 5)
