"""transformers `kyutai/mimi` layout: HF's MimiModel on a converted file agrees with us, and we load that file.

The Kyutai -> transformers conversion is written here, independently of the loader's reverse conversion, so a
shared mistake in both directions cannot cancel out: HF's own MimiModel must produce our codes from this file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from inference.models.moshi.mimi import MimiCodec, MimiConfig, load_mimi
from inference.models.moshi.mimi_loading import detect_layout

FRAME = 1920


def interleaved_to_half_split(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Kyutai rotates pairs (2i, 2i+1); transformers rotates (i, i + d/2): reorder each head's rows."""
    out_dim, in_dim = weight.shape
    head_dim = out_dim // heads
    return weight.view(heads, head_dim // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


LAYER_NAMES = {
    "self_attn.out_proj.weight": "self_attn.o_proj.weight",
    "linear1.weight": "mlp.fc1.weight",
    "linear2.weight": "mlp.fc2.weight",
    "norm1.weight": "input_layernorm.weight",
    "norm1.bias": "input_layernorm.bias",
    "norm2.weight": "post_attention_layernorm.weight",
    "norm2.bias": "post_attention_layernorm.bias",
    "layer_scale_1.scale": "self_attn_layer_scale.scale",
    "layer_scale_2.scale": "mlp_layer_scale.scale",
}


def kyutai_to_hf(state: dict[str, torch.Tensor], heads: int) -> dict[str, torch.Tensor]:
    """Kyutai names -> the flat names of the `kyutai/mimi` hub checkpoint."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if m := re.fullmatch(
            r"(encoder|decoder)\.model\.(\d+)\.(block\.\d+\.)?(conv\.conv|convtr\.convtr)\.(\w+)", key
        ):
            side, index, block, _, param = m.groups()
            out[f"{side}.layers.{index}.{block or ''}conv.{param}"] = value
        elif m := re.fullmatch(r"(encoder|decoder)_transformer\.transformer\.layers\.(\d+)\.(.+)", key):
            side, index, rest = m.groups()
            prefix = f"{side}_transformer.layers.{index}."
            if rest == "self_attn.in_proj_weight":
                q, k, v = value.chunk(3, dim=0)
                out[prefix + "self_attn.q_proj.weight"] = interleaved_to_half_split(q, heads)
                out[prefix + "self_attn.k_proj.weight"] = interleaved_to_half_split(k, heads)
                out[prefix + "self_attn.v_proj.weight"] = v
            else:
                out[prefix + LAYER_NAMES[rest]] = value
        elif key == "downsample.conv.conv.conv.weight":
            out["downsample.conv.weight"] = value
        elif key == "upsample.convtr.convtr.convtr.weight":
            out["upsample.conv.weight"] = value
        elif m := re.fullmatch(r"quantizer\.(rvq_first|rvq_rest)\.(.+)", key):
            part, rest = m.groups()
            name = "semantic" if part == "rvq_first" else "acoustic"
            rest = re.sub(r"^vq\.layers\.(\d+)\._codebook\.", r"layers.\1.codebook.", rest)
            rest = rest.replace("embedding_sum", "embed_sum").replace("._initialized", ".initialized")
            out[f"quantizer.{name}_residual_vector_quantizer.{rest}"] = value
        else:
            raise AssertionError(f"no transformers name for {key}")
    return {k: v.contiguous() for k, v in out.items()}


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
def converted(request, tmp_path_factory, tiny_config):
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
