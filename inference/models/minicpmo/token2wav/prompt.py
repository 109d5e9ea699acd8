"""The voice prompt path of Token2Wav: a 16 kHz clip -> S3 speech tokens, CAM++ speaker embedding, prompt mel.

- S3 tokens (25 Hz): Whisper-style 128-bin log-mel, the S3 tokenizer v2 encoder (two stride-2 convs, then
  blocks of rotary attention with an FSMN memory on the values) and an FSQ head (8 dims x 3 levels ->
  one of 6561 codes). Its weights are read from the initializers of ``speech_tokenizer_v2_25hz.onnx``, by
  the node names of the published graph; the graph itself is never executed.
- Speaker embedding: Kaldi fbank (80 bins, mean-normalised over time), then ``campplus.onnx`` through
  onnxruntime, after its signature was checked.
- Prompt mel: the clip resampled to 24 kHz (windowed-sinc, as torchaudio's ``Resample``), the 1920-point
  50 Hz log-mel (fmax 8 kHz), padded by repetition to two frames per prompt token.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from transformers.audio_utils import mel_filter_bank

from inference.models.minicpmo.token2wav.config import AssetError
from inference.models.minicpmo.token2wav.loading import CAMPPLUS_ONNX, TOKENIZER_ONNX, check_onnx
from inference.models.minicpmo.token2wav.stream import PromptFeatures


def _slaney(n_fft: int, n_mels: int, rate: int, fmax: float) -> torch.Tensor:
    bank = mel_filter_bank(
        num_frequency_bins=1 + n_fft // 2,
        num_mel_filters=n_mels,
        min_frequency=0.0,
        max_frequency=fmax,
        sampling_rate=rate,
        norm="slaney",
        mel_scale="slaney",
    )
    return torch.from_numpy(np.asarray(bank, dtype=np.float32).T.copy())  # [n_mels, bins]


def s3_log_mel(audio: torch.Tensor) -> torch.Tensor:
    """[N] at 16 kHz -> [128, N // 160] (last STFT frame dropped, floor at max - 8, (x + 4) / 4)."""
    spec = torch.stft(audio, 400, 160, window=torch.hann_window(400), return_complex=True)
    power = spec[..., :-1].abs() ** 2
    log = torch.clamp(_slaney(400, 128, 16000, 8000.0) @ power, min=1e-10).log10()
    log = torch.maximum(log, log.max() - 8.0)
    return (log + 4.0) / 4.0


def kaldi_fbank(audio: torch.Tensor) -> torch.Tensor:
    """Kaldi's fbank (25 ms Povey frames every 10 ms, 80 log mel bins over 20 Hz-8 kHz) of [N] at 16 kHz."""
    frame, shift, n_fft = 400, 160, 512
    n = 1 + (audio.numel() - frame) // shift
    frames = audio.as_strided((n, frame), (shift, 1))
    frames = frames - frames.mean(dim=1, keepdim=True)
    prev = F.pad(frames.unsqueeze(0), (1, 0), mode="replicate").squeeze(0)
    frames = frames - 0.97 * prev[:, :-1]
    frames = frames * torch.hann_window(frame, periodic=False).pow(0.85)
    frames = F.pad(frames, (0, n_fft - frame))
    power = torch.fft.rfft(frames).abs().pow(2.0)
    mel = lambda f: 1127.0 * math.log(1.0 + f / 700.0)  # noqa: E731
    lo, hi = mel(20.0), mel(8000.0)
    delta = (hi - lo) / 81
    fft_mel = 1127.0 * (1.0 + torch.arange(n_fft // 2) * (16000 / n_fft) / 700.0).log()
    left = lo + torch.arange(80).unsqueeze(1) * delta
    centre, right = left + delta, left + 2 * delta
    up = (fft_mel - left) / (centre - left)
    down = (right - fft_mel) / (right - centre)
    banks = F.pad(torch.max(torch.zeros(1), torch.min(up, down)), (0, 1))  # [80, 257]
    energies = torch.mm(power, banks.T)
    return torch.max(energies, torch.tensor(torch.finfo(torch.float32).eps)).log()


def resample_16k_to_24k(audio: torch.Tensor) -> torch.Tensor:
    """Windowed-sinc resampling (Hann window, 6 zero crossings, roll-off 0.99), torchaudio's kernel and layout."""
    orig, new, zeros, rolloff = 2, 3, 6, 0.99
    base = min(orig, new) * rolloff
    width = math.ceil(zeros * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    t = torch.arange(0, -new, -1)[:, None, None] / new + idx
    t = (t * base).clamp_(-zeros, zeros)
    window = torch.cos(t * math.pi / zeros / 2) ** 2
    t = t * math.pi
    kernel = (torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t) * (window * base / orig)).float()
    x = F.pad(audio.view(1, -1), (width, width + orig))
    out = F.conv1d(x[:, None], kernel, stride=orig).transpose(1, 2).reshape(1, -1)
    return out[..., : math.ceil(new * audio.numel() / orig)]


def prompt_mel_24k(audio24: torch.Tensor) -> torch.Tensor:
    """[1, N] at 24 kHz -> log-mel [1, N // 480, 80] (n_fft 1920, hop 480, no centering, reflect pad 720)."""
    y = F.pad(audio24.unsqueeze(1), (720, 720), mode="reflect").squeeze(1)
    spec = torch.view_as_real(
        torch.stft(
            y,
            1920,
            hop_length=480,
            win_length=1920,
            window=torch.hann_window(1920),
            center=False,
            normalized=False,
            onesided=True,
            return_complex=True,
        )
    )
    mag = torch.sqrt(spec.pow(2).sum(-1) + 1e-9)
    mel = torch.matmul(_slaney(1920, 80, 24000, 8000.0), mag)
    return torch.log(torch.clamp(mel, min=1e-5)).transpose(1, 2)


class S3Block(nn.Module):
    """Pre-norm rotary attention with an FSMN memory, then a GELU MLP."""

    def __init__(self, d: int, heads: int, kernel: int = 31):
        super().__init__()
        self.heads = heads
        self.attn = nn.Module()
        self.attn.query, self.attn.key = nn.Linear(d, d), nn.Linear(d, d, bias=False)
        self.attn.value, self.attn.out = nn.Linear(d, d), nn.Linear(d, d)
        self.attn.fsmn_block = nn.Conv1d(d, d, kernel, groups=d, bias=False)
        self.attn_ln = nn.LayerNorm(d, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.mlp_ln = nn.LayerNorm(d)
        self.pad = ((kernel - 1) // 2, kernel - 1 - (kernel - 1) // 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.attn_ln(x)
        b, t, d = h.shape
        q = self.attn.query(h).view(b, t, self.heads, -1)
        k = self.attn.key(h).view(b, t, self.heads, -1)
        v = self.attn.value(h).view(b, t, self.heads, -1)

        def rot(z: torch.Tensor) -> torch.Tensor:
            half = z.shape[-1] // 2
            return z * cos + torch.cat((-z[..., half:], z[..., :half]), dim=-1) * sin

        q, k = rot(q), rot(k)
        flat = v.reshape(b, t, -1)
        memory = self.attn.fsmn_block(F.pad(flat.transpose(1, 2), self.pad)).transpose(1, 2) + flat
        scale = (d // self.heads) ** -0.25
        w = torch.softmax((q.permute(0, 2, 1, 3) * scale) @ (k.permute(0, 2, 3, 1) * scale), dim=-1)
        att = (w @ v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3).flatten(start_dim=2)
        x = x + self.attn.out(att) + memory
        return x + self.mlp(self.mlp_ln(x))


class S3Tokenizer(nn.Module):
    """S3 tokenizer v2, inference on one unpadded clip; sizes come from the weights (head width 64)."""

    def __init__(self, weights: dict[str, torch.Tensor]):
        super().__init__()
        d, n_mels = weights["encoder.conv1.weight"].shape[:2]
        layers = 1 + max(int(k.split(".")[2]) for k in weights if k.startswith("encoder.blocks."))
        self.conv1 = nn.Conv1d(n_mels, d, 3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        self.blocks = nn.ModuleList(S3Block(d, d // 64) for _ in range(layers))
        self.project_down = nn.Linear(d, 8)
        renamed = {k.replace("encoder.", "", 1).replace("quantizer._codebook.", ""): v for k, v in weights.items()}
        self.load_state_dict(renamed, strict=True)
        freqs = 1.0 / (10000.0 ** (torch.arange(0, 64, 2)[:32].float() / 64))
        angles = torch.outer(torch.arange(2048), freqs).float()
        self.cos = torch.cat([angles.cos()] * 2, dim=-1)
        self.sin = torch.cat([angles.sin()] * 2, dim=-1)

    @torch.inference_mode()
    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [128, T] -> tokens [1, ceil(T / 4)] (int64)."""
        x = F.gelu(self.conv1(mel.unsqueeze(0)))
        x = F.gelu(self.conv2(x)).permute(0, 2, 1)
        t = x.shape[1]
        cos, sin = self.cos[:t][None, :, None], self.sin[:t][None, :, None]
        for block in self.blocks:
            x = block(x, cos, sin)
        h = torch.tanh(self.project_down(x).float()).clamp(-1 + 1e-6, 1 - 1e-6)
        digits = ((h + 1.0) * (3 - 1) / 2.0).round().to(torch.int64)
        return (digits * 3 ** torch.arange(8, dtype=torch.int64)).sum(dim=-1)


def read_tokenizer_weights(path: Path) -> dict[str, torch.Tensor]:
    """The S3 tokenizer's weights from the initializers of its ONNX graph, named as the published graph names them."""
    import onnx
    from onnx import numpy_helper

    check_onnx(path)
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    special = {
        "onnx::Conv_2216": "encoder.conv1.weight",
        "onnx::Conv_2217": "encoder.conv1.bias",
        "onnx::Conv_2218": "encoder.conv2.weight",
        "onnx::Conv_2219": "encoder.conv2.bias",
        "onnx::MatMul_2536": "quantizer._codebook.project_down.weight",
        "quantizer.project_in.bias": "quantizer._codebook.project_down.bias",
    }
    out: dict[str, torch.Tensor] = {}
    for node in model.graph.node:
        for name in node.input:
            if name not in inits:
                continue
            arr = torch.from_numpy(numpy_helper.to_array(inits[name]).copy())
            if node.op_type == "LayerNormalization":
                base = "encoder." + node.name.replace("/LayerNormalization", "")[1:].replace("/", ".")
                role = "weight" if name == node.input[1] else "bias"
                out[f"{base}.{role}"] = arr
                continue
            if name in special:
                key = special[name]
            elif "blocks" in node.name:
                key = "encoder." + (
                    node.name[1:]
                    .replace("/", ".")
                    .replace("MatMul", "weight")
                    .replace("Add_1", "bias")
                    .replace("Mul", "weight")
                    .replace("Add", "bias")
                    .replace("mlp.mlp", "mlp")
                    .replace("fsmn_block.Conv", "fsmn_block.weight")
                )
            else:
                continue
            out[key] = arr if arr.dim() > 2 else arr.t()
    return out


class PromptEncoder:
    """Turns a voice clip into the flow's prompt features; built once per asset directory."""

    def __init__(self, asset_dir: Path):
        import onnxruntime

        try:
            self.tokenizer = S3Tokenizer(read_tokenizer_weights(asset_dir / TOKENIZER_ONNX)).eval()
        except (RuntimeError, KeyError, ValueError) as exc:
            raise AssetError(f"{asset_dir / TOKENIZER_ONNX}: weights do not fit the S3 tokenizer ({exc})") from exc
        check_onnx(asset_dir / CAMPPLUS_ONNX)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        self.campplus = onnxruntime.InferenceSession(
            str(asset_dir / CAMPPLUS_ONNX), sess_options=options, providers=["CPUExecutionProvider"]
        )

    @torch.inference_mode()
    def encode(self, audio16k: np.ndarray) -> PromptFeatures:
        """Prompt features of a float32 mono clip at 16 kHz (at least 0.1 s)."""
        audio = torch.from_numpy(np.ascontiguousarray(audio16k, dtype=np.float32))
        tokens = self.tokenizer(s3_log_mel(audio))
        fbank = kaldi_fbank(audio)
        fbank = fbank - fbank.mean(dim=0, keepdim=True)
        name = self.campplus.get_inputs()[0].name
        spk = torch.from_numpy(self.campplus.run(None, {name: fbank.unsqueeze(0).numpy()})[0])
        mel = prompt_mel_24k(resample_16k_to_24k(audio))
        mel = F.pad(mel, (0, 0, 0, tokens.shape[1] * 2 - mel.shape[1]), mode="replicate")
        return PromptFeatures(tokens=tokens, spk=spk.float(), mel=mel)
