"""Native Mimi codec (Kyutai): 24 kHz audio <-> 12.5 Hz frames of split-RVQ codes, streaming both ways.

Pipeline, one 80 ms frame (1920 samples) at a time:

    encode: pcm [B,1,1920] -> SEANet encoder (causal convs, hop 960) -> [B,D,2]
            -> encoder transformer (RoPE, layer scale, ring KV over `context` steps) -> stride-2 conv -> [B,D,1]
            -> split RVQ (1 semantic codebook + acoustic codebooks) -> codes [B,K,1]
    decode: codes [B,K,1] -> dequantise [B,D,1] -> depthwise stride-2 transposed conv -> [B,D,2]
            -> decoder transformer -> SEANet decoder (causal convs + transposed convs) -> pcm [B,1,1920]

Streaming state is explicit (house style, habit 8): `MimiCodec.init_stream(B)` returns a `MimiStreamState`
holding every conv tail, transposed-conv overlap, KV ring and position offset, with `reset(mask)` per batch row.
Causal convs keep their last `kernel - stride` inputs and transposed convs keep their `kernel - stride` overlap
tail, so frame-by-frame decoding equals whole-clip decoding (transformers 5.x keeps no such state on decode).

The module tree mirrors the names of Kyutai's published Mimi checkpoint (`encoder.model.0.conv.conv.weight`,
`quantizer.rvq_first.vq.layers.0._codebook.embedding_sum`, ...), so that file loads without renaming; the
transformers layout is translated in `mimi_loading.py`, which also holds `load_mimi` (this module imports nothing
from it); the configuration is `mimi_config.py`. Numerics follow moshi 0.2.13 (fp32 RoPE, `cdist` +
`argmin` codebook search, moshi's ring-KV window) so codes match the reference exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from inference.models.moshi.mimi_config import (
    MimiConfig,
    MimiConfigError,
    QuantizerConfig,
    SeanetConfig,
    TransformerConfig,
    is_integer,
)

# The configuration classes are mimi_config's; they are exported here too, for callers that build a codec.
__all__ = [
    "MimiCodec",
    "MimiConfig",
    "MimiConfigError",
    "MimiInputError",
    "MimiStreamState",
    "QuantizerConfig",
    "SeanetConfig",
    "TransformerConfig",
]


class MimiInputError(ValueError):
    """Audio or codes given to the codec have the wrong shape, dtype, batch size or value range."""


# --------------------------------------------------------------------------------------------------------------
# Streaming state
# --------------------------------------------------------------------------------------------------------------


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape a [B] mask so it broadcasts over `like` along dim 0."""
    return mask.view(-1, *([1] * (like.dim() - 1)))


class _LayerState:
    """Per-layer streaming tensors whose batch dim is 0; `reset(mask)` zeroes the masked rows in place."""

    def reset(self, mask: torch.Tensor) -> None:
        raise NotImplementedError


class _ConvState(_LayerState):
    def __init__(self, previous: torch.Tensor, replicate: bool) -> None:
        self.previous = previous  # [B, C_in, effective_kernel - stride]: last inputs, left context of the next call
        self.replicate = replicate
        # [B]: true until the row's first call, whose first sample then fills `previous` (replicate padding).
        self.first = torch.ones(previous.shape[0], dtype=torch.bool, device=previous.device)

    def reset(self, mask: torch.Tensor) -> None:
        self.previous.masked_fill_(_rows(mask, self.previous), 0.0)
        self.first |= mask


class _ConvTrState(_LayerState):
    def __init__(self, partial: torch.Tensor) -> None:
        self.partial = partial  # [B, C_out, kernel - stride]: overlap tail (bias excluded) added to the next call

    def reset(self, mask: torch.Tensor) -> None:
        self.partial.masked_fill_(_rows(mask, self.partial), 0.0)


class _AttentionState(_LayerState):
    def __init__(self, batch_size: int, heads: int, capacity: int, head_dim: int, device, dtype) -> None:
        self.capacity = capacity
        self.keys = torch.zeros(batch_size, heads, capacity, head_dim, device=device, dtype=dtype)
        self.values = torch.zeros_like(self.keys)
        self.end_offset = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B] steps written so far

    def reset(self, mask: torch.Tensor) -> None:
        # Stale keys stay in the ring but become invalid once end_offset is 0 (positions are rebuilt every step).
        self.end_offset.masked_fill_(mask, 0)


class _TransformerState(_LayerState):
    def __init__(self, offset: torch.Tensor, layers: list[_AttentionState]) -> None:
        self.offset = offset  # [B] RoPE position of the next step
        self.layers = layers

    def reset(self, mask: torch.Tensor) -> None:
        self.offset.masked_fill_(mask, 0)
        for layer in self.layers:
            layer.reset(mask)


class _StateList(_LayerState):
    def __init__(self, items: list[_LayerState | None]) -> None:
        self.items = items

    def reset(self, mask: torch.Tensor) -> None:
        for item in self.items:
            if item is not None:
                item.reset(mask)


class MimiStreamState:
    """Everything a batch of codec streams remembers between frames, one row per slot.

    Attributes:
        batch_size: number of rows (slots).
        device: where the state tensors live.
        encoder: SEANet encoder conv tails, encoder transformer KV, downsampling conv tail.
        decoder: upsampling overlap, decoder transformer KV, SEANet decoder conv tails and overlaps.
    """

    def __init__(
        self, batch_size: int, device: torch.device, encoder: list[_LayerState], decoder: list[_LayerState]
    ) -> None:
        self.batch_size = batch_size
        self.device = device
        self.encoder = encoder
        self.decoder = decoder

    def reset(self, mask: torch.Tensor | None = None, *, encoder: bool = True, decoder: bool = True) -> None:
        """Restart the masked rows (all rows when `mask` is None) as fresh streams; other rows are untouched.

        Args:
            mask: BoolTensor [B]; True rows are reset.
            encoder: reset the encoding side.
            decoder: reset the decoding side.
        """
        if mask is None:
            mask = torch.ones(self.batch_size, dtype=torch.bool)
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (self.batch_size,):
            raise MimiInputError(f"reset mask must be a BoolTensor of shape [{self.batch_size}], got {_describe(mask)}")
        parts = (self.encoder if encoder else []) + (self.decoder if decoder else [])
        for part in parts:
            part.reset(mask.to(self.device))


def state_tensors(obj: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor inside a codec stream state, with a stable path (the state is plain objects and lists)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            yield from state_tensors(item, f"{path}[{i}]")
    elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
        for name, value in vars(obj).items():
            yield from state_tensors(value, f"{path}.{name}")


def per_row_tensors(state: MimiStreamState) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a codec stream state that hold one row per slot (batch first), with their paths."""
    return [(path, t) for path, t in state_tensors(state) if t.dim() and t.shape[0] == state.batch_size]


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor {tuple(x.shape)} {x.dtype}"
    return type(x).__name__


# --------------------------------------------------------------------------------------------------------------
# Convolutions
# --------------------------------------------------------------------------------------------------------------


class _Holder(nn.Module):
    """One level of nesting, so parameter names match Kyutai's (`conv.conv.weight`, `convtr.convtr.weight`)."""

    def __init__(self, name: str, module: nn.Module) -> None:
        super().__init__()
        self.add_module(name, module)


class CausalConv1d(nn.Module):
    """Causal Conv1d that left-pads by `effective_kernel - stride`; streaming keeps those inputs as state.

    Whole-signal and streamed calls give the same outputs because the whole-signal call starts from the same
    all-zero (or, for `replicate`, first-sample) left context as a fresh stream.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, dilation: int = 1,
                 groups: int = 1, bias: bool = True, pad_mode: str = "constant") -> None:  # fmt: skip
        super().__init__()
        self.conv = _Holder("conv", nn.Conv1d(in_channels, out_channels, kernel_size, stride, dilation=dilation,
                                              groups=groups, bias=bias))  # fmt: skip
        self.stride = stride
        self.context = (kernel_size - 1) * dilation + 1 - stride
        self.replicate = pad_mode == "replicate"

    @property
    def inner(self) -> nn.Conv1d:
        return self.conv.conv

    def init_state(self, batch_size: int) -> _ConvState:
        w = self.inner.weight
        previous = torch.zeros(batch_size, self.inner.in_channels, self.context, device=w.device, dtype=w.dtype)
        return _ConvState(previous, self.replicate)

    def forward(self, x: torch.Tensor, state: _ConvState | None = None) -> torch.Tensor:
        # x: [B, C_in, T] with T a multiple of the stride -> [B, C_out, T // stride]
        if self.context == 0:
            return self.inner(x)
        if state is None:
            if self.replicate:
                left = x[..., :1].expand(-1, -1, self.context)
            else:
                left = x.new_zeros(x.shape[0], x.shape[1], self.context)
        else:
            if self.replicate:
                first = _rows(state.first, state.previous)
                state.previous.copy_(torch.where(first, x[..., :1].expand_as(state.previous), state.previous))
                state.first.zero_()
            left = state.previous
        x = torch.cat([left, x], dim=-1)
        y = self.inner(x)
        if state is not None:
            state.previous.copy_(x[..., -self.context :])
        return y


class CausalConvTranspose1d(nn.Module):
    """Causal ConvTranspose1d: trims `kernel - stride` on the right; streaming carries that tail forward."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, groups: int = 1,
                 bias: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.convtr = _Holder("convtr", nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride,
                                                           groups=groups, bias=bias))  # fmt: skip
        self.tail = kernel_size - stride

    @property
    def inner(self) -> nn.ConvTranspose1d:
        return self.convtr.convtr

    def init_state(self, batch_size: int) -> _ConvTrState:
        w = self.inner.weight
        return _ConvTrState(torch.zeros(batch_size, self.inner.out_channels, self.tail, device=w.device, dtype=w.dtype))

    def forward(self, x: torch.Tensor, state: _ConvTrState | None = None) -> torch.Tensor:
        # x: [B, C_in, T] -> [B, C_out, T * stride]
        y = self.inner(x)  # [B, C_out, T * stride + tail]
        if self.tail == 0:
            return y
        if state is None:
            return y[..., : -self.tail]
        y[..., : self.tail] += state.partial
        tail = y[..., -self.tail :]
        if self.inner.bias is not None:
            tail = tail - self.inner.bias[:, None]  # the bias is added once, by the call that emits the sample
        state.partial.copy_(tail)
        return y[..., : -self.tail]


class ResnetBlock(nn.Module):
    """SEANet residual block: x + conv1x1(ELU(conv_k(ELU(x)))), identity shortcut."""

    def __init__(self, dim: int, kernel_size: int, dilation: int, compress: int, pad_mode: str) -> None:
        super().__init__()
        hidden = dim // compress
        self.block = nn.ModuleList(
            [
                nn.ELU(),
                CausalConv1d(dim, hidden, kernel_size, dilation=dilation, pad_mode=pad_mode),
                nn.ELU(),
                CausalConv1d(hidden, dim, 1, pad_mode=pad_mode),
            ]
        )

    def init_state(self, batch_size: int) -> _StateList:
        return _init_states(self.block, batch_size)

    def forward(self, x: torch.Tensor, state: _StateList | None = None) -> torch.Tensor:
        return x + _run_layers(self.block, x, state)


def _init_states(layers: nn.ModuleList, batch_size: int) -> _StateList:
    return _StateList([layer.init_state(batch_size) if hasattr(layer, "init_state") else None for layer in layers])


def _run_layers(layers: nn.ModuleList, x: torch.Tensor, state: _StateList | None) -> torch.Tensor:
    for i, layer in enumerate(layers):
        if isinstance(layer, nn.ELU):
            x = layer(x)
        else:
            x = layer(x, None if state is None else state.items[i])
    return x


class SeanetEncoder(nn.Module):
    """SEANet encoder: pcm [B, 1, T] -> latent [B, dimension, T / hop]."""

    def __init__(self, cfg: SeanetConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv1d(cfg.channels, cfg.n_filters, cfg.kernel_size, pad_mode=cfg.pad_mode)]
        width = cfg.n_filters
        for ratio in reversed(cfg.ratios):  # the config lists decoder order; the encoder downsamples in reverse
            for j in range(cfg.n_residual_layers):
                layers.append(
                    ResnetBlock(width, cfg.residual_kernel_size, cfg.dilation_base**j, cfg.compress, cfg.pad_mode)
                )
            layers += [nn.ELU(), CausalConv1d(width, width * 2, 2 * ratio, stride=ratio, pad_mode=cfg.pad_mode)]
            width *= 2
        layers += [nn.ELU(), CausalConv1d(width, cfg.dimension, cfg.last_kernel_size, pad_mode=cfg.pad_mode)]
        self.model = nn.ModuleList(layers)

    def init_state(self, batch_size: int) -> _StateList:
        return _init_states(self.model, batch_size)

    def forward(self, x: torch.Tensor, state: _StateList | None = None) -> torch.Tensor:
        return _run_layers(self.model, x, state)


class SeanetDecoder(nn.Module):
    """SEANet decoder: latent [B, dimension, F] -> pcm [B, 1, F * hop]."""

    def __init__(self, cfg: SeanetConfig) -> None:
        super().__init__()
        width = cfg.n_filters * 2 ** len(cfg.ratios)
        layers: list[nn.Module] = [CausalConv1d(cfg.dimension, width, cfg.kernel_size, pad_mode=cfg.pad_mode)]
        for ratio in cfg.ratios:
            layers += [nn.ELU(), CausalConvTranspose1d(width, width // 2, 2 * ratio, stride=ratio)]
            for j in range(cfg.n_residual_layers):
                layers.append(
                    ResnetBlock(width // 2, cfg.residual_kernel_size, cfg.dilation_base**j, cfg.compress, cfg.pad_mode)
                )
            width //= 2
        layers += [nn.ELU(), CausalConv1d(width, cfg.channels, cfg.last_kernel_size, pad_mode=cfg.pad_mode)]
        self.model = nn.ModuleList(layers)

    def init_state(self, batch_size: int) -> _StateList:
        return _init_states(self.model, batch_size)

    def forward(self, x: torch.Tensor, state: _StateList | None = None) -> torch.Tensor:
        return _run_layers(self.model, x, state)


class ConvDownsample(nn.Module):
    """Learnt stride-`s` conv (kernel 2s, replicate left padding) from the SEANet rate to the frame rate."""

    def __init__(self, stride: int, dimension: int) -> None:
        super().__init__()
        self.conv = CausalConv1d(dimension, dimension, 2 * stride, stride=stride, bias=False, pad_mode="replicate")

    def init_state(self, batch_size: int) -> _ConvState:
        return self.conv.init_state(batch_size)

    def forward(self, x: torch.Tensor, state: _ConvState | None = None) -> torch.Tensor:
        return self.conv(x, state)


class ConvTrUpsample(nn.Module):
    """Learnt depthwise transposed conv (kernel 2s, stride s) from the frame rate back to the SEANet rate.

    Depthwise (groups = dimension) as in the published checkpoint (moshi's `upsample_channel_wise_bug=True`).
    """

    def __init__(self, stride: int, dimension: int) -> None:
        super().__init__()
        self.convtr = CausalConvTranspose1d(dimension, dimension, 2 * stride, stride=stride, groups=dimension,
                                            bias=False)  # fmt: skip

    def init_state(self, batch_size: int) -> _ConvTrState:
        return self.convtr.init_state(batch_size)

    def forward(self, x: torch.Tensor, state: _ConvTrState | None = None) -> torch.Tensor:
        return self.convtr(x, state)


# --------------------------------------------------------------------------------------------------------------
# Transformer
# --------------------------------------------------------------------------------------------------------------


def apply_rope(x: torch.Tensor, positions: torch.Tensor, max_period: float) -> torch.Tensor:
    """Rotate interleaved pairs (2i, 2i+1) of `x` [B, H, T, D] by angle `positions * max_period^(-2i/D)`.

    Args:
        x: queries or keys, [B, H, T, D].
        positions: [B, T] absolute positions (computed in float32 as the reference does).
        max_period: RoPE base.
    """
    B, H, T, D = x.shape
    half = torch.arange(D // 2, device=x.device, dtype=torch.float32)
    freqs = torch.exp(half * (-math.log(max_period) * 2 / D))  # [D/2]
    angles = positions.float().view(B, 1, T, 1) * freqs  # [B, 1, T, D/2]
    cos, sin = torch.cos(angles), torch.sin(angles)
    pairs = x.view(B, H, T, D // 2, 2)
    real, imag = pairs[..., 0].float(), pairs[..., 1].float()
    out = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)  # [B, H, T, D/2, 2]
    return out.to(x.dtype).view(B, H, T, D)


class MimiAttention(nn.Module):
    """Causal multi-head self-attention over a sliding `context` window, fused q|k|v projection, no biases."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.d_model // cfg.num_heads
        self.context = cfg.context
        self.max_period = float(cfg.max_period)
        self.in_proj_weight = nn.Parameter(torch.empty(3 * cfg.d_model, cfg.d_model))  # rows q|k|v, each (h d)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def init_state(self, batch_size: int, personaplex: bool) -> _AttentionState:
        # PersonaPlex's ring: one slot fewer (see MimiCodec.init_stream)
        capacity = self.context - 1 if personaplex else self.context
        w = self.in_proj_weight
        return _AttentionState(batch_size, self.num_heads, capacity, self.head_dim, w.device, w.dtype)

    def forward(self, x: torch.Tensor, offset: torch.Tensor, state: _AttentionState | None) -> torch.Tensor:
        # x: [B, T, C]; offset: [B] position of x[:, 0]
        B, T, C = x.shape
        qkv = F.linear(x, self.in_proj_weight).view(B, T, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, T, D]
        pos_q = offset.view(-1, 1) + torch.arange(T, device=x.device).view(1, -1)  # [B, T]
        q = apply_rope(q, pos_q, self.max_period)
        k = apply_rope(k, pos_q, self.max_period)
        if state is None:
            pos_k = pos_q  # whole clip: every key of the clip is present
        else:
            k, v, pos_k = self._ring_append(state, k, v)  # k, v: [B, H, capacity, D]; pos_k: [B, capacity]
        delta = pos_q[:, :, None] - pos_k[:, None, :]  # [B, T, Tk]
        mask = (pos_k[:, None, :] >= 0) & (delta >= 0) & (delta < self.context)
        y = F.scaled_dot_product_attention(q, k, v, mask[:, None])  # [B, H, T, D]
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))

    @staticmethod
    def _ring_append(
        state: _AttentionState, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write T new keys/values into the ring and return the whole ring with each slot's position (-1 = empty).

        Same window as moshi's RingKVCache: the ring holds `context` slots, so once it has wrapped a query at
        the start of a multi-step call sees one key fewer than a whole-clip pass would (kept for bit parity).
        """
        B, H, T, D = k.shape
        cap = state.capacity
        slots = (state.end_offset.view(-1, 1) + torch.arange(T, device=k.device)) % cap  # [B, T]
        index = slots.view(B, 1, T, 1).expand(B, H, T, D)
        state.keys.scatter_(2, index, k)
        state.values.scatter_(2, index, v)
        last = state.end_offset.view(-1, 1) + T - 1  # [B, 1] position of the newest key
        ring = torch.arange(cap, device=k.device).view(1, -1)  # [1, cap]
        delta = ring - last % cap
        positions = torch.where(delta <= 0, last + delta, last + delta - cap)  # [B, cap]
        state.end_offset += T
        positions = torch.where(ring >= state.end_offset.view(-1, 1), torch.full_like(positions, -1), positions)
        return state.keys, state.values, positions


class LayerScale(nn.Module):
    """Per-channel residual scale (Touvron et al. 2021)."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class MimiTransformerLayer(nn.Module):
    """Pre-norm layer: x + ls1 * attn(LN(x)); x + ls2 * linear2(GELU(linear1(LN(x))))."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MimiAttention(cfg)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=1e-5)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=1e-5)
        self.linear1 = nn.Linear(cfg.d_model, cfg.dim_feedforward, bias=False)
        self.linear2 = nn.Linear(cfg.dim_feedforward, cfg.d_model, bias=False)
        if cfg.layer_scale is None:
            self.layer_scale_1: nn.Module = nn.Identity()
            self.layer_scale_2: nn.Module = nn.Identity()
        else:
            self.layer_scale_1 = LayerScale(cfg.d_model, cfg.layer_scale)
            self.layer_scale_2 = LayerScale(cfg.d_model, cfg.layer_scale)

    def forward(self, x: torch.Tensor, offset: torch.Tensor, state: _AttentionState | None) -> torch.Tensor:
        x = x + self.layer_scale_1(self.self_attn(self.norm1(x), offset, state))
        return x + self.layer_scale_2(self.linear2(F.gelu(self.linear1(self.norm2(x)))))


class _Layers(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([MimiTransformerLayer(cfg) for _ in range(cfg.num_layers)])


class MimiTransformer(nn.Module):
    """Conv-layout transformer: [B, C, T] -> [B, C, T], optional in/out projections when widths differ."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.transformer = _Layers(cfg)
        self.input_proj = None
        if cfg.input_dimension != cfg.d_model:
            self.input_proj = nn.Linear(cfg.input_dimension, cfg.d_model, bias=False)
        out_dim = cfg.output_dimensions[0]
        self.output_projs = nn.ModuleList(
            [nn.Identity() if out_dim == cfg.d_model else nn.Linear(cfg.d_model, out_dim, bias=False)]
        )

    def init_state(self, batch_size: int, personaplex: bool) -> _TransformerState:
        layers = [layer.self_attn.init_state(batch_size, personaplex) for layer in self.transformer.layers]
        offset = torch.zeros(batch_size, dtype=torch.long, device=layers[0].end_offset.device)
        return _TransformerState(offset, layers)

    def forward(self, x: torch.Tensor, state: _TransformerState | None = None) -> torch.Tensor:
        x = x.transpose(1, 2)  # [B, T, C]
        if self.input_proj is not None:
            x = self.input_proj(x)
        offset = x.new_zeros(x.shape[0], dtype=torch.long) if state is None else state.offset
        for i, layer in enumerate(self.transformer.layers):
            x = layer(x, offset, None if state is None else state.layers[i])
        if state is not None:
            state.offset += x.shape[1]
        return self.output_projs[0](x).transpose(1, 2)


# --------------------------------------------------------------------------------------------------------------
# Quantiser
# --------------------------------------------------------------------------------------------------------------


class Codebook(nn.Module):
    """Euclidean codebook stored as EMA sums: centroid = embedding_sum / max(cluster_usage, eps)."""

    def __init__(self, dim: int, bins: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("_initialized", torch.tensor([False], dtype=torch.float))
        self.register_buffer("cluster_usage", torch.ones(bins))
        self.register_buffer("embedding_sum", torch.zeros(bins, dim))
        self.register_buffer("embedding", torch.zeros(bins, dim), persistent=False)  # derived; see refresh()
        self.register_load_state_dict_post_hook(lambda module, _keys: module.refresh())

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute the centroids from the stored sums (after loading or editing the buffers)."""
        self.embedding.copy_(self.embedding_sum / self.cluster_usage.clamp(min=self.eps)[:, None])

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        # x: [N, dim] -> codes [N], nearest centroid (torch.cdist + argmin, as the reference)
        return torch.cdist(x[None], self.embedding[None], p=2)[0].argmin(dim=-1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return F.embedding(codes, self.embedding)


class _VQ(nn.Module):
    def __init__(self, dim: int, bins: int) -> None:
        super().__init__()
        self._codebook = Codebook(dim, bins)


class _VQLayers(nn.Module):
    def __init__(self, dim: int, bins: int, n_q: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_VQ(dim, bins) for _ in range(n_q)])


class ResidualVQ(nn.Module):
    """Residual VQ with 1x1 conv projections in and out of the codebook space."""

    def __init__(self, cfg: QuantizerConfig, n_q: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(cfg.input_dimension, cfg.dimension, 1, bias=False)
        self.output_proj = nn.Conv1d(cfg.dimension, cfg.output_dimension, 1, bias=False)
        self.vq = _VQLayers(cfg.dimension, cfg.bins, n_q)

    def encode(self, x: torch.Tensor, n_q: int) -> torch.Tensor:
        # x: [B, D_in, F] -> codes [B, n_q, F]
        residual = self.input_proj(x).transpose(1, 2)  # [B, F, dim]
        B, Fr, dim = residual.shape
        codes = []
        for layer in self.vq.layers[:n_q]:
            book = layer._codebook
            idx = book.encode(residual.reshape(B * Fr, dim)).view(B, Fr)
            residual = residual - book.decode(idx)
            codes.append(idx)
        return torch.stack(codes, dim=1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        # codes: [B, K, F] -> [B, D_out, F]
        quantized = sum(self.vq.layers[k]._codebook.decode(codes[:, k]) for k in range(codes.shape[1]))
        return self.output_proj(quantized.transpose(1, 2))


class SplitResidualVQ(nn.Module):
    """Semantic RVQ (`rvq_first`) and acoustic RVQ (`rvq_rest`) both quantise the same latent; codes concatenate."""

    def __init__(self, cfg: QuantizerConfig) -> None:
        super().__init__()
        self.n_q_semantic = cfg.n_q_semantic
        self.rvq_first = ResidualVQ(cfg, cfg.n_q_semantic)
        self.rvq_rest = ResidualVQ(cfg, cfg.n_q - cfg.n_q_semantic)

    def encode(self, x: torch.Tensor, num_codebooks: int) -> torch.Tensor:
        codes = self.rvq_first.encode(x, self.n_q_semantic)
        if num_codebooks > self.n_q_semantic:
            codes = torch.cat([codes, self.rvq_rest.encode(x, num_codebooks - self.n_q_semantic)], dim=1)
        return codes

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        out = self.rvq_first.decode(codes[:, : self.n_q_semantic])
        if codes.shape[1] > self.n_q_semantic:
            out = out + self.rvq_rest.decode(codes[:, self.n_q_semantic :])
        return out


# --------------------------------------------------------------------------------------------------------------
# Codec
# --------------------------------------------------------------------------------------------------------------


class MimiCodec(nn.Module):
    """Mimi neural audio codec, whole-clip and streaming, batched with independent rows.

    Args:
        config: codec hyper-parameters.
        num_codebooks: codebooks produced by `encode` and expected by `decode` (1 semantic + acoustic).

    Attributes:
        frame_size: samples per frame (1920 at 24 kHz / 12.5 Hz).
        sample_rate: audio sample rate in Hz.
        frame_rate: frames per second.
        num_codebooks: active codebooks K.
        cardinality: codes per codebook (valid codes are 0 .. cardinality-1).
    """

    def __init__(self, config: MimiConfig, num_codebooks: int = 8) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.encoder = SeanetEncoder(config.seanet)
        self.decoder = SeanetDecoder(config.seanet)
        self.encoder_transformer = MimiTransformer(config.transformer)
        self.decoder_transformer = MimiTransformer(config.transformer)
        self.quantizer = SplitResidualVQ(config.quantizer)
        self.downsample = ConvDownsample(config.resample_stride, config.seanet.dimension)
        self.upsample = ConvTrUpsample(config.resample_stride, config.seanet.dimension)
        self.frame_size = config.frame_size
        self.sample_rate = config.sample_rate
        self.frame_rate = config.frame_rate
        self.cardinality = config.quantizer.bins
        self.num_codebooks = 0
        self.set_num_codebooks(num_codebooks)

    def set_num_codebooks(self, n: int) -> None:
        """Choose how many codebooks encode produces / decode consumes (n_q_semantic .. n_q)."""
        q = self.config.quantizer
        if not is_integer(n) or not q.n_q_semantic <= n <= q.n_q:
            raise MimiConfigError(f"num_codebooks must be an integer in [{q.n_q_semantic}, {q.n_q}], got {n!r}")
        self.num_codebooks = n

    @property
    def _param(self) -> torch.Tensor:
        return self.quantizer.rvq_first.input_proj.weight

    # --- whole clip -------------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, pcm: torch.Tensor) -> torch.Tensor:
        """Encode a whole clip; the tail is zero-padded to a whole frame.

        Args:
            pcm: float [B, 1, T] at `sample_rate`.

        Returns:
            codes: int64 [B, K, ceil(T / frame_size)].
        """
        self._check_pcm(pcm, whole=True)
        pcm = pcm.to(self._param)
        pad = -pcm.shape[-1] % self.frame_size
        if pad:
            pcm = F.pad(pcm, (0, pad))
        latent = self.downsample(self.encoder_transformer(self.encoder(pcm)))  # [B, D, F]
        return self.quantizer.encode(latent, self.num_codebooks)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Decode whole-clip codes [B, K, F] to pcm [B, 1, F * frame_size]."""
        self._check_codes(codes, validate=True)
        latent = self.upsample(self.quantizer.decode(codes.to(self._param.device, torch.long)))  # [B, D, 2F]
        return self.decoder(self.decoder_transformer(latent))

    # --- streaming --------------------------------------------------------------------------------------------

    def init_stream(self, batch_size: int, *, personaplex: bool = False) -> MimiStreamState:
        """Fresh streaming state for `batch_size` independent rows, on the codec's device and dtype.

        `personaplex` selects the transformers' attention window of the NVIDIA/personaplex fork instead of moshi
        0.2.13's. The fork's older `RingKVCache` rebuilds slot positions from the offset after the write, so the
        slot the next step overwrites (the oldest key) gets a future position and is masked: once its ring is
        full, every query sees one key fewer. A ring of `context - 1` slots holds exactly the keys it sees.
        """
        if not is_integer(batch_size) or batch_size < 1:
            raise MimiInputError(f"batch_size must be a positive integer, got {batch_size!r}")
        if personaplex and self.config.transformer.context < 2:
            raise MimiInputError("the PersonaPlex attention window needs a transformer context of at least 2")
        encoder = [
            self.encoder.init_state(batch_size),
            self.encoder_transformer.init_state(batch_size, personaplex),
            self.downsample.init_state(batch_size),
        ]
        decoder = [
            self.upsample.init_state(batch_size),
            self.decoder_transformer.init_state(batch_size, personaplex),
            self.decoder.init_state(batch_size),
        ]
        return MimiStreamState(batch_size, self._param.device, encoder, decoder)

    @torch.no_grad()
    def encode_step(self, pcm: torch.Tensor, state: MimiStreamState) -> torch.Tensor:
        """Encode one frame per row: pcm [B, 1, frame_size] -> codes int64 [B, K, 1]."""
        self._check_pcm(pcm, whole=False, state=state)
        seanet, transformer, downsample = state.encoder
        x = self.encoder(pcm.to(self._param), seanet)  # [B, D, frame_size / hop]
        x = self.downsample(self.encoder_transformer(x, transformer), downsample)  # [B, D, 1]
        return self.quantizer.encode(x, self.num_codebooks)

    @torch.no_grad()
    def decode_step(self, codes: torch.Tensor, state: MimiStreamState, *, validate: bool = True) -> torch.Tensor:
        """Decode one frame per row: codes [B, K, 1] -> pcm [B, 1, frame_size].

        Args:
            codes: integer codes [B, K, 1] in 0 .. cardinality-1.
            state: the stream state from `init_stream`.
            validate: check the code range (a host sync; pass False on a graphed hot path whose codes are known
                to be in range).
        """
        self._check_codes(codes, validate=validate, state=state)
        upsample, transformer, seanet = state.decoder
        x = self.upsample(self.quantizer.decode(codes.to(self._param.device, torch.long)), upsample)  # [B, D, 2]
        return self.decoder(self.decoder_transformer(x, transformer), seanet)

    # --- input checks -----------------------------------------------------------------------------------------

    def _check_pcm(self, pcm: Any, *, whole: bool, state: MimiStreamState | None = None) -> None:
        if not isinstance(pcm, torch.Tensor) or not pcm.is_floating_point() or pcm.dim() != 3 or pcm.shape[1] != 1:
            raise MimiInputError(f"pcm must be a float tensor [B, 1, T], got {_describe(pcm)}")
        if whole:
            if pcm.shape[0] < 1 or pcm.shape[-1] < 1:
                raise MimiInputError(f"pcm must hold at least one sample per row, got {_describe(pcm)}")
            return
        assert state is not None
        expected = (state.batch_size, 1, self.frame_size)
        if tuple(pcm.shape) != expected:
            raise MimiInputError(f"encode_step expects pcm of shape {list(expected)}, got {_describe(pcm)}")

    def _check_codes(self, codes: Any, *, validate: bool, state: MimiStreamState | None = None) -> None:
        if not isinstance(codes, torch.Tensor) or codes.is_floating_point() or codes.is_complex() or codes.dim() != 3:
            raise MimiInputError(f"codes must be an integer tensor [B, K, F], got {_describe(codes)}")
        if codes.dtype == torch.bool:
            raise MimiInputError("codes must be integers, got bool")
        if codes.shape[1] != self.num_codebooks:
            raise MimiInputError(f"codes must have K={self.num_codebooks} codebooks, got {_describe(codes)}")
        if codes.shape[0] < 1 or codes.shape[2] < 1:
            raise MimiInputError(f"codes must hold at least one frame per row, got {_describe(codes)}")
        if state is not None and tuple(codes.shape) != (state.batch_size, self.num_codebooks, 1):
            raise MimiInputError(
                f"decode_step expects codes of shape [{state.batch_size}, {self.num_codebooks}, 1], "
                f"got {_describe(codes)}"
            )
        if validate and bool(((codes < 0) | (codes >= self.cardinality)).any()):
            bad = codes[(codes < 0) | (codes >= self.cardinality)][0].item()
            raise MimiInputError(f"codes must lie in [0, {self.cardinality}), found {bad}")
