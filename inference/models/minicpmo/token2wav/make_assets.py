"""Tiny random Token2Wav assets in the published layout, for tests and the demo checkpoint.

Writes ``flow.yaml`` (a small flow: narrow encoder, one DiT block), ``flow.pt`` and ``hift.pt`` (plain tensor
state dicts; HiFT's weight-normed convs stored as ``weight_g`` / ``weight_v`` pairs as the published file
has them), ``campplus.onnx`` (a runnable model with CAM++'s signature: fbank [B, T, 80] -> embedding [B, 192])
and ``speech_tokenizer_v2_25hz.onnx`` (the S3 tokenizer's signature, feats [B, 128, T] + feats_length [B] ->
indices [B, T / 4], with its weights as initializers of nodes named as in the published graph, which is how
both the reference and ``prompt.py`` read them). Every tensor is a function of the seed.

The estimator keeps the published width (hidden 512, 8 x 64 heads): the reference's DiT writes its caches
into fixed buffers of that shape. Everything else is shrunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from inference.models.minicpmo.token2wav.config import DiTConfig, EncoderConfig, FlowConfig, flow_yaml_text
from inference.models.minicpmo.token2wav.flow import CausalFlow
from inference.models.minicpmo.token2wav.hift import HiFT

TINY_FLOW = FlowConfig(
    input_size=64,
    output_size=80,
    spk_embed_dim=192,
    vocab_size=6561,
    inference_cfg_rate=0.7,
    encoder=EncoderConfig(
        input_size=64,
        output_size=64,
        pre_lookahead_len=3,
        num_blocks=1,
        num_up_blocks=1,
        attention_heads=2,
        linear_units=128,
    ),
    estimator=DiTConfig(
        in_channels=320, out_channels=80, mlp_ratio=0.25, depth=1, num_heads=8, head_dim=64, hidden_size=512
    ),
)
TINY_HIFT_CHANNELS = 64  # HiFT base channels (published: 512) and F0 predictor channels (published: 512)


@dataclass(frozen=True)
class TinyTokenizer:
    """S3 tokenizer v2 dimensions of the tiny assets (published: 1280 wide, 20 heads, 6 layers)."""

    n_mels: int = 128
    n_state: int = 128
    n_head: int = 2  # head width 64: the rotary table is fixed at 64
    n_layer: int = 2
    fsmn_kernel: int = 31


def _fill(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=gen)
    leaf = name.rsplit(".", 1)[-1]
    owner = name.rsplit(".", 2)[-2] if name.count(".") else ""
    if leaf == "alpha" or (leaf == "weight" and len(shape) == 1):  # Snake alphas, LayerNorm weights
        return 1.0 + 0.1 * x
    if leaf == "bias" or len(shape) == 1 or owner.startswith("pos_bias") or leaf.startswith("pos_bias"):
        return 0.02 * x
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
    return x / math.sqrt(fan_in)


def random_state_dict(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: _fill(k, tuple(v.shape), gen).contiguous() for k, v in module.state_dict().items()}


WEIGHT_NORMED = ("f0_predictor.condnet.", "conv_pre.", "ups.", "resblocks.", "source_resblocks.", "conv_post.")


def hift_published_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HiFT weights as the published file holds them: weight-normed convs as (weight_g, weight_v)."""
    out = {}
    for key, value in sd.items():
        normed = key.endswith(".weight") and value.dim() == 3 and key.startswith(WEIGHT_NORMED)
        if normed and not key.startswith("source_downs"):
            base = key[: -len(".weight")]
            out[base + ".weight_v"] = value
            out[base + ".weight_g"] = torch.norm_except_dim(value, 2, 0)
        else:
            out[key] = value
    return out


def _campplus_onnx(path: Path, seed: int) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((80, 192)) / math.sqrt(80)).astype(np.float32)
    b = (0.02 * rng.standard_normal(192)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["input", "axes"], ["pooled"], keepdims=0, name="pool"),
        helper.make_node("MatMul", ["pooled", "proj.weight"], ["proj"], name="proj"),
        helper.make_node("Add", ["proj", "proj.bias"], ["output"], name="bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "campplus_tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["B", "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["B", 192])],
        [
            numpy_helper.from_array(w, "proj.weight"),
            numpy_helper.from_array(b, "proj.bias"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def tokenizer_weights(dims: TinyTokenizer, seed: int) -> dict[str, np.ndarray]:
    """Random S3 tokenizer v2 weights, torch layout (Linear [out, in]), by module name."""
    rng = np.random.default_rng(seed)

    def lin(o: int, i: int) -> np.ndarray:
        return (rng.standard_normal((o, i)) / math.sqrt(i)).astype(np.float32)

    def vec(n: int, base: float = 0.0, scale: float = 0.02) -> np.ndarray:
        return (base + scale * rng.standard_normal(n)).astype(np.float32)

    d = dims.n_state
    w = {
        "encoder.conv1.weight": (rng.standard_normal((d, dims.n_mels, 3)) / math.sqrt(3 * dims.n_mels)).astype(
            np.float32
        ),
        "encoder.conv1.bias": vec(d),
        "encoder.conv2.weight": (rng.standard_normal((d, d, 3)) / math.sqrt(3 * d)).astype(np.float32),
        "encoder.conv2.bias": vec(d),
    }
    for i in range(dims.n_layer):
        p = f"encoder.blocks.{i}."
        for name in ("query", "key", "value", "out"):
            w[p + f"attn.{name}.weight"] = lin(d, d)
            if name != "key":
                w[p + f"attn.{name}.bias"] = vec(d)
        w[p + "attn.fsmn_block.weight"] = (0.1 * rng.standard_normal((d, 1, dims.fsmn_kernel))).astype(np.float32)
        w[p + "attn_ln.weight"], w[p + "attn_ln.bias"] = vec(d, 1.0, 0.1), vec(d)
        w[p + "mlp.0.weight"], w[p + "mlp.0.bias"] = lin(4 * d, d), vec(4 * d)
        w[p + "mlp.2.weight"], w[p + "mlp.2.bias"] = lin(d, 4 * d), vec(d)
        w[p + "mlp_ln.weight"], w[p + "mlp_ln.bias"] = vec(d, 1.0, 0.1), vec(d)
    w["quantizer._codebook.project_down.weight"] = lin(8, d) * 4.0  # wide enough that tanh spreads over 3 levels
    w["quantizer._codebook.project_down.bias"] = vec(8)
    return w


def _tokenizer_onnx(path: Path, dims: TinyTokenizer, seed: int) -> None:
    """The weights as initializers of nodes named like the published graph's, plus a runnable signature."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = tokenizer_weights(dims, seed)
    inits, nodes = [], []
    special = {
        "encoder.conv1.weight": "onnx::Conv_2216",
        "encoder.conv1.bias": "onnx::Conv_2217",
        "encoder.conv2.weight": "onnx::Conv_2218",
        "encoder.conv2.bias": "onnx::Conv_2219",
        "quantizer._codebook.project_down.weight": "onnx::MatMul_2536",
        "quantizer._codebook.project_down.bias": "quantizer.project_in.bias",
    }
    for name, value in weights.items():
        if name in special:
            init = special[name]
            arr = value.T.copy() if name.endswith("project_down.weight") else value
            inits.append(numpy_helper.from_array(arr, init))
            nodes.append(helper.make_node("Identity", [init], [init + "_out"], name=f"/{init}/Identity"))
            continue
        block = name[len("encoder.") :]  # blocks.0.attn.query.weight
        module, leaf = block.rsplit(".", 1)
        scope = "/" + module.replace("mlp.", "mlp/mlp.").replace(".attn", "/attn").replace(".mlp", "/mlp")
        scope = scope.replace("attn.", "attn/").replace("/attn_ln", "/attn_ln")
        if module.endswith("_ln"):
            if leaf == "bias":
                continue  # added with its weight below
            node_name = scope + "/LayerNormalization"
            w_init, b_init = f"{block}", f"{module}.bias"
            inits += [
                numpy_helper.from_array(value, w_init),
                numpy_helper.from_array(weights["encoder." + module + ".bias"], b_init),
            ]
            nodes.append(
                helper.make_node("LayerNormalization", ["ln_in", w_init, b_init], [node_name + "_out"], name=node_name)
            )
            continue
        if module.endswith("fsmn_block"):
            node_name, arr = scope + "/Conv", value
        elif leaf == "weight":
            node_name, arr = scope + "/MatMul", value.T.copy()
        else:
            node_name, arr = scope + "/Add", value
        init = block + "_init"
        inits.append(numpy_helper.from_array(arr, init))
        op = {"Conv": "Identity", "MatMul": "Identity", "Add": "Identity"}[node_name.rsplit("/", 1)[-1]]
        nodes.append(helper.make_node(op, [init], [node_name + "_out"], name=node_name))

    # Constants are nodes, not initializers: the weight readers take every initializer for a weight.
    def const(name: str, value: np.ndarray) -> None:
        nodes.insert(
            0, helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name), name=f"/sig/{name}")
        )

    const("ln_in", np.zeros((1, dims.n_state), np.float32))
    # The runnable part: feats [B, 128, T] -> indices [B, ceil(T / 4)] (argmax over the first 8 bins of every
    # 4th frame); it gives the file the published signature. Neither side executes the tokenizer graph.
    const("starts", np.array([0, 0], np.int64))
    const("ends", np.array([8, 1 << 30], np.int64))
    const("axes", np.array([1, 2], np.int64))
    const("steps", np.array([1, 4], np.int64))
    nodes += [
        helper.make_node("Slice", ["feats", "starts", "ends", "axes", "steps"], ["every4"], name="/sig/Slice"),
        helper.make_node("ArgMax", ["every4"], ["argmax"], axis=1, keepdims=0, name="/sig/ArgMax"),
        helper.make_node("Cast", ["argmax"], ["indices"], to=TensorProto.INT32, name="/sig/Cast"),
    ]
    graph = helper.make_graph(
        nodes,
        "speech_tokenizer_v2_tiny",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, ["B", dims.n_mels, "T"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, ["B"]),
        ],
        [helper.make_tensor_value_info("indices", TensorProto.INT32, ["B", "T4"])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def make_token2wav_assets(out_dir: str | Path, *, seed: int = 1234, published_sizes: bool = False) -> Path:
    """Write the five files into ``out_dir`` (created if needed); returns it.

    ``published_sizes``: the flow decoder and HiFT at the published shapes (``FlowConfig()`` and 512 HiFT
    channels: what runs per unit, for speed figures); the two prompt-side ONNX models stay tiny either way.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    flow = FlowConfig() if published_sizes else TINY_FLOW
    (out / "flow.yaml").write_text(flow_yaml_text(flow))
    torch.save(random_state_dict(CausalFlow(flow), seed), out / "flow.pt")
    channels = 512 if published_sizes else TINY_HIFT_CHANNELS
    hift = HiFT(base_channels=channels, f0_channels=channels)
    torch.save(hift_published_dict(random_state_dict(hift, seed + 1)), out / "hift.pt")
    _campplus_onnx(out / "campplus.onnx", seed + 2)
    _tokenizer_onnx(out / "speech_tokenizer_v2_25hz.onnx", TinyTokenizer(), seed + 3)
    return out
