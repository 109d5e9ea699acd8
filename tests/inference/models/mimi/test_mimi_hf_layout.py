"""transformers `kyutai/mimi` layout: HF's MimiModel on a converted file agrees with us, and we load that file.

The Kyutai -> transformers conversion (conftest `kyutai_to_hf`) is written independently of the loader's reverse
conversion, so a shared mistake in both directions cannot cancel out: HF's own MimiModel must produce our codes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from inference.models.moshi.mimi import MimiCodec
from inference.models.moshi.mimi_config import MimiConfig
from inference.models.moshi.mimi_loading import detect_layout, load_mimi

FRAME = 1920


def hf_config(config: MimiConfig):
    from transformers import MimiConfig as HFMimiConfig

    t, q, s = config.transformer, config.quantizer, config.seanet
    return HFMimiConfig(
        hidden_size=s.dimension,
        num_filters=s.n_filters,
        upsampling_ratios=list(s.ratios),
        codebook_size=q.bins,
        codebook_dim=q.dimension,
        vector_quantization_hidden_dimension=q.dimension,
        num_quantizers=q.n_q,
        num_hidden_layers=t.num_layers,
        num_attention_heads=t.num_heads,
        num_key_value_heads=t.num_heads,
        intermediate_size=t.dim_feedforward,
        upsample_groups=s.dimension,
        sliding_window=t.context,
    )


@pytest.fixture(scope="module", params=["golden", "random"])
def converted(request, tmp_path_factory, tiny_config, kyutai_to_hf):
    """(our codec, directory holding a `kyutai/mimi`-style model.safetensors + config.json)."""
    codec: MimiCodec = request.getfixturevalue(f"{request.param}_codec")
    directory = tmp_path_factory.mktemp(f"hf_{request.param}")
    state = {k: v for k, v in codec.state_dict().items()}
    save_file(kyutai_to_hf(state, tiny_config.transformer.num_heads), str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(hf_config(tiny_config).to_dict()))
    return codec, directory


@pytest.fixture(scope="module")
def hf_model(converted):
    from transformers import MimiModel

    _, directory = converted
    model, info = MimiModel.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def test_transformers_mimi_encodes_to_our_codes(converted, hf_model, test_audio):
    codec, _ = converted
    with torch.no_grad():
        hf_codes = hf_model.encode(test_audio, num_quantizers=8).audio_codes
    assert torch.equal(hf_codes, codec.encode(test_audio))


def test_transformers_whole_clip_decode_matches_ours(converted, hf_model, random_codes):
    codec, _ = converted
    with torch.no_grad():
        hf_pcm = hf_model.decode(random_codes).audio_values
    torch.testing.assert_close(hf_pcm, codec.decode(random_codes), rtol=0, atol=1e-4)


def test_load_mimi_reads_the_hub_layout(converted, tiny_config, test_audio, random_codes):
    codec, directory = converted
    path = directory / "model.safetensors"
    loaded = load_mimi(path, tiny_config, num_codebooks=8)
    from safetensors.torch import load_file

    assert detect_layout(load_file(str(path)).keys()) == "hf"
    ours = codec.state_dict()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, ours[key]), key
    assert torch.equal(loaded.encode(test_audio), codec.encode(test_audio))
    assert torch.equal(loaded.decode(random_codes), codec.decode(random_codes))


def test_load_mimi_reads_the_transformers_module_layout(converted, hf_model, tiny_config, tmp_path: Path):
    # transformers 5.x nests the halves (`encoder.encoder_seanet.layers...`); a state dict saved from the module.
    codec, _ = converted
    path = tmp_path / "nested.safetensors"
    save_file({k: v.contiguous() for k, v in hf_model.state_dict().items()}, str(path))
    from safetensors.torch import load_file

    assert detect_layout(load_file(str(path)).keys()) == "hf_nested"
    loaded = load_mimi(path, tiny_config, num_codebooks=8)
    ours = codec.state_dict()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, ours[key]), key
