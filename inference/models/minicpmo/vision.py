"""Vision input of MiniCPM-o 4.5: SigLIP (NaViT) tower and the 64-query perceiver resampler.

One camera frame (448 x 448 RGB, ``max_slice_nums = 1`` so no slices) becomes 64 LLM embeddings. The encoder
layers are ``transformers``' SigLIP layers; the NaViT embedding (patch grid bucketed onto the 70 x 70
position table) and the resampler are written here because transformers has no MiniCPM-V equivalents.
Parameter names follow the published ``vpm.*`` / ``resampler.*`` layout.
"""

from __future__ import annotations

import io
import math

import numpy as np
import torch
from torch import nn
from transformers import SiglipVisionConfig
from transformers.models.siglip.modeling_siglip import SiglipEncoderLayer

from inference.image_header import MAX_FRAME_PIXELS
from inference.models.minicpmo.config import MiniCPMOConfig, VisionConfig


class FrameError(ValueError):
    """A camera frame could not be decoded or has an unusable shape."""


def best_frame_size(width: int, height: int, scale: int, patch: int) -> tuple[int, int]:
    """Unsliced frame size (``max_slice_nums = 1``): area scale**2 at the frame's aspect ratio, in whole patches."""
    ratio = width / height
    h = int(scale / math.sqrt(ratio))
    w = int(h * ratio)
    return max(round(w / patch) * patch, patch), max(round(h / patch) * patch, patch)


def decode_frame(data: bytes, scale: int, patch: int = 14) -> np.ndarray:
    """JPEG/PNG bytes -> uint8 [H, W, 3] RGB, resized (bicubic) as the reference processor does.

    A 448 x 448 frame stays as it is; a 640 x 480 webcam frame becomes 518 x 392 (37 x 28 patches).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            # open() has read only the header: refuse the size it declares before a pixel is decoded,
            # so a small, highly compressed file cannot make us allocate a huge bitmap.
            if img.width < 1 or img.height < 1 or img.width * img.height > MAX_FRAME_PIXELS:
                raise FrameError(f"camera frame has an unusable size {img.width}x{img.height}")
            img = img.convert("RGB")
            size = best_frame_size(img.width, img.height, scale, patch)
            if img.size != size:
                img = img.resize(size, Image.Resampling.BICUBIC)
            return np.asarray(img, dtype=np.uint8).copy()
    except FrameError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise FrameError(f"camera frame is not a decodable image ({exc})") from exc


class NaViTEmbeddings(nn.Module):
    """Patch embedding plus a learned position table indexed by fractional-coordinate buckets."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.patch_size = cfg.patch_size
        self.side = cfg.patches_per_side
        self.patch_embedding = nn.Conv2d(3, cfg.hidden_size, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.position_embedding = nn.Embedding(self.side * self.side, cfg.hidden_size)

    def position_ids(self, grid_h: int, grid_w: int) -> torch.Tensor:
        """Map a grid_h x grid_w patch grid onto the side x side table (row-major ids)."""
        boundaries = torch.arange(1 / self.side, 1.0, 1 / self.side)
        frac_h = torch.arange(0, 1 - 1e-6, 1 / grid_h)
        frac_w = torch.arange(0, 1 - 1e-6, 1 / grid_w)
        bucket_h = torch.bucketize(frac_h, boundaries, right=True)
        bucket_w = torch.bucketize(frac_w, boundaries, right=True)
        return (bucket_h[:, None] * self.side + bucket_w).flatten()

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] normalised pixels -> [B, (H/p)(W/p), D] patch embeddings (row-major)."""
        x = self.patch_embedding(pixels)  # [B, D, H/p, W/p]
        grid_h, grid_w = x.shape[-2:]
        x = x.flatten(2).transpose(1, 2)  # [B, N, D]
        ids = self.position_ids(grid_h, grid_w).to(self.position_embedding.weight.device)
        return x + self.position_embedding(ids)


class SiglipTower(nn.Module):
    """NaViT SigLIP encoder; the checkpoint carries only the layers that run (last one dropped)."""

    def __init__(self, cfg: VisionConfig, layers_run: int):
        super().__init__()
        hf_cfg = SiglipVisionConfig(
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_attention_heads=cfg.num_attention_heads,
            num_hidden_layers=layers_run,
            patch_size=cfg.patch_size,
            image_size=cfg.image_size,
            layer_norm_eps=cfg.layer_norm_eps,
            hidden_act="gelu_pytorch_tanh",
        )
        hf_cfg._attn_implementation = "sdpa"
        self.embeddings = NaViTEmbeddings(cfg)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(SiglipEncoderLayer(hf_cfg) for _ in range(layers_run))
        self.post_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """[B, 3, H, W] -> ([B, N, D], (grid_h, grid_w))."""
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x, None)
        grid = (pixels.shape[-2] // self.embeddings.patch_size, pixels.shape[-1] // self.embeddings.patch_size)
        return self.post_layernorm(x), grid


def sincos_2d(embed_dim: int, grid_h: int, grid_w: int) -> torch.Tensor:
    """2-D sin-cos position table [grid_h * grid_w, embed_dim]: first half encodes the column, second the row."""
    half = embed_dim // 2
    omega = np.arange(half // 2, dtype=np.float32) / (half / 2.0)
    omega = 1.0 / 10000**omega  # [half/2]
    cols, rows = np.meshgrid(np.arange(grid_w, dtype=np.float32), np.arange(grid_h, dtype=np.float32))

    def one_axis(pos: np.ndarray) -> np.ndarray:
        out = np.einsum("hw,d->hwd", pos, omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=-1)

    table = np.concatenate([one_axis(cols), one_axis(rows)], axis=-1)  # [H, W, D]
    return torch.from_numpy(table.reshape(grid_h * grid_w, embed_dim)).float()


class Resampler(nn.Module):
    """64 learned queries cross-attend (one ``nn.MultiheadAttention``) to the projected patch states."""

    def __init__(self, num_queries: int, embed_dim: int, kv_dim: int):
        super().__init__()
        self.embed_dim = embed_dim
        self.query = nn.Parameter(torch.zeros(num_queries, embed_dim))
        self.kv_proj = nn.Linear(kv_dim, embed_dim, bias=False)
        self.attn = nn.MultiheadAttention(embed_dim, max(1, embed_dim // 128))
        self.ln_q = nn.LayerNorm(embed_dim, eps=1e-6)
        self.ln_kv = nn.LayerNorm(embed_dim, eps=1e-6)
        self.ln_post = nn.LayerNorm(embed_dim, eps=1e-6)
        self.proj = nn.Parameter(torch.zeros(embed_dim, embed_dim))
        self._pos_cache: dict[tuple[int, int], torch.Tensor] = {}

    def _pos(self, grid: tuple[int, int], device: torch.device) -> torch.Tensor:
        if grid not in self._pos_cache:
            self._pos_cache[grid] = sincos_2d(self.embed_dim, *grid).to(device)
        return self._pos_cache[grid]

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """[B, N, kv_dim] patch states -> [B, Q, D]."""
        B = x.shape[0]
        kv = self.ln_kv(self.kv_proj(x)).transpose(0, 1)  # [N, B, D]
        pos = self._pos(grid, x.device).to(x.dtype)[:, None, :]  # [N, 1, D]
        q = self.ln_q(self.query)[:, None, :].expand(-1, B, -1)  # [Q, B, D]
        out = self.attn(q, kv + pos, kv, need_weights=False)[0]  # [Q, B, D]
        return self.ln_post(out.transpose(0, 1)) @ self.proj


class VisionInput(nn.Module):
    """Frame -> 64 LLM embeddings (``vpm`` + ``resampler``)."""

    def __init__(self, cfg: MiniCPMOConfig):
        super().__init__()
        self.image_size = cfg.image_size
        self.vpm = SiglipTower(cfg.vision, cfg.vision_layers_run)
        self.resampler = Resampler(cfg.query_num, cfg.hidden_size, cfg.vision.hidden_size)

    @torch.inference_mode()
    def embed_frame(self, frame: np.ndarray) -> torch.Tensor:
        """uint8 [H, W, 3] RGB frame (sides in whole patches, see ``decode_frame``) -> [query_num, llm_dim]."""
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise FrameError(f"frame must be uint8 [H, W, 3], got {frame.dtype} {frame.shape}")
        patch = self.vpm.embeddings.patch_size
        if frame.shape[0] % patch or frame.shape[1] % patch or frame.shape[0] * frame.shape[1] > (70 * patch) ** 2:
            raise FrameError(f"frame sides must be multiples of {patch} within 70 patches, got {frame.shape[:2]}")
        dtype = self.resampler.query.dtype
        pixels = torch.from_numpy(frame).permute(2, 0, 1).float()[None]  # [1, 3, H, W]
        pixels = ((pixels / 255.0 - 0.5) / 0.5).to(device=self.resampler.query.device, dtype=dtype)
        states, grid = self.vpm(pixels)
        return self.resampler(states, grid)[0]
