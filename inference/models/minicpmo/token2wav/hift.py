"""HiFT vocoder of Token2Wav (``hift.pt``): 50 Hz 80-bin mel -> 24 kHz audio.

A neural-source-filter HiFi-GAN with an iSTFT head (CosyVoice's ``HiFTGenerator``): an F0 predictor drives a
harmonic sine source; the mel is upsampled x8, x5, x3 through transposed convs with Snake resblocks, the
source's STFT is mixed in at each scale, and the 18 output channels are the magnitude (exp) and phase (sin)
of a 16-point iSTFT with hop 4. The architecture constants are fixed in the reference; only the channel
widths are read from the weights, so small random assets can shrink them.

The source draws random numbers (initial harmonic phases and additive noise) on every call; a generator per
row makes them repeatable (the reference draws from the global RNG in the same order and shapes), and lets a
batch of streams give each row the draws its own stream would get alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy.signal import get_window
from torch import nn
from torch.nn import functional as F

SAMPLE_RATE = 24000
UPSAMPLE_RATES = (8, 5, 3)
UPSAMPLE_KERNELS = (16, 11, 7)
N_FFT, HOP = 16, 4
SAMPLES_PER_FRAME = int(np.prod(UPSAMPLE_RATES)) * HOP  # 480: one 50 Hz mel frame
RESBLOCK_KERNELS = (3, 7, 11)
SOURCE_KERNELS = (7, 7, 11)
DILATIONS = (1, 3, 5)
HARMONICS = 8
SINE_AMP, NOISE_STD, VOICED_THRESHOLD = 0.1, 0.003, 10.0
LRELU_SLOPE = 0.1
AUDIO_LIMIT = 0.99


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha, per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
        return x + (1.0 / (alpha + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


class ResBlock(nn.Module):
    """Three (Snake, dilated conv, Snake, conv) residual steps."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, dilation=d, padding=(kernel * d - d) // 2) for d in DILATIONS
        )
        self.convs2 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, padding=(kernel - 1) // 2) for _ in DILATIONS)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in DILATIONS)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in DILATIONS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for a1, c1, a2, c2 in zip(self.activations1, self.convs1, self.activations2, self.convs2, strict=True):
            x = c2(a2(c1(a1(x)))) + x
        return x


class F0Predictor(nn.Module):
    """Five conv + ELU layers, a linear head, |.|: mel [b, 80, t] -> F0 in Hz [b, t]."""

    def __init__(self, in_channels: int, channels: int):
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(5):
            layers += [nn.Conv1d(in_channels if i == 0 else channels, channels, 3, padding=1), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return torch.abs(self.classifier(self.condnet(mel).transpose(1, 2)).squeeze(-1))


class SineSource(nn.Module):
    """``m_source``: F0 at 24 kHz -> harmonic sines (phase integrated at the frame rate) + noise -> 1 channel.

    The random numbers are drawn apart (``draw``) so that a batch can give each row its own generator's draws.
    """

    def __init__(self):
        super().__init__()
        self.l_linear = nn.Linear(HARMONICS + 1, 1)

    @staticmethod
    def draw(f0: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The draws of one call for f0 [b, L, 1], in the reference's order, shapes and layouts.

        Returns the initial phases [b, harmonics + 1] and the unit noise [b, L, harmonics + 1].
        """
        b, length, n = f0.shape[0], f0.shape[1], HARMONICS + 1
        rand_ini = torch.rand(b, n, device=f0.device, generator=generator)
        # randn_like of the sines in the reference: the sines are a transposed [b, n, L] tensor, and a
        # non-contiguous fill draws in its own order, so the noise is drawn into that same layout.
        noise = torch.empty(b, n, length, device=f0.device).transpose(1, 2).normal_(generator=generator)
        # The reference also draws a noise branch it never uses; drawn here so later draws line up.
        torch.empty(b, length, 1, device=f0.device).normal_(generator=generator)
        return rand_ini, noise

    def forward(self, f0: torch.Tensor, rand_ini: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """f0 [b, L, 1] and the call's draws (``draw``) -> source [b, L, 1]."""
        harmonics = torch.arange(1, HARMONICS + 2, dtype=torch.float32, device=f0.device)
        fn = f0 * harmonics[None, None]
        rad = (fn / SAMPLE_RATE) % 1
        rand_ini[:, 0] = 0
        rad[:, 0, :] = rad[:, 0, :] + rand_ini
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / SAMPLES_PER_FRAME, mode="linear").transpose(1, 2)
        phase = torch.cumsum(rad, dim=1) * 2 * np.pi
        phase = F.interpolate(
            phase.transpose(1, 2) * SAMPLES_PER_FRAME, scale_factor=SAMPLES_PER_FRAME, mode="linear"
        ).transpose(1, 2)
        sines = torch.sin(phase) * SINE_AMP
        uv = (f0 > VOICED_THRESHOLD).type(torch.float32)
        noise_amp = uv * NOISE_STD + (1 - uv) * SINE_AMP / 3
        sines = sines * uv + noise_amp * noise
        return torch.tanh(self.l_linear(sines))


class HiFT(nn.Module):
    """``hift``: parameter names follow the published ``hift.pt`` (weight norm folded at load)."""

    def __init__(self, base_channels: int = 512, f0_channels: int = 512, in_channels: int = 80):
        super().__init__()
        self.base_channels = base_channels
        self.m_source = SineSource()
        self.f0_predictor = F0Predictor(in_channels, f0_channels)
        self.conv_pre = nn.Conv1d(in_channels, base_channels, 7, 1, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(base_channels // 2**i, base_channels // 2 ** (i + 1), k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(UPSAMPLE_RATES, UPSAMPLE_KERNELS, strict=True))
        )
        # Source STFT brought down to each scale: strides 15, 3, 1 for the x8, x40, x120 stages.
        down = np.cumprod([1, *UPSAMPLE_RATES[::-1][:-1]])[::-1]
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (u, k) in enumerate(zip(down, SOURCE_KERNELS, strict=True)):
            ch = base_channels // 2 ** (i + 1)
            u = int(u)
            conv = nn.Conv1d(N_FFT + 2, ch, 1, 1) if u == 1 else nn.Conv1d(N_FFT + 2, ch, u * 2, u, padding=u // 2)
            self.source_downs.append(conv)
            self.source_resblocks.append(ResBlock(ch, k))
        self.resblocks = nn.ModuleList(
            ResBlock(base_channels // 2 ** (i + 1), k) for i in range(len(UPSAMPLE_RATES)) for k in RESBLOCK_KERNELS
        )
        ch = base_channels // 2 ** len(UPSAMPLE_RATES)
        self.conv_post = nn.Conv1d(ch, N_FFT + 2, 7, 1, padding=3)
        window = torch.from_numpy(get_window("hann", N_FFT, fftbins=True).astype(np.float32))
        self.register_buffer("stft_window", window, persistent=False)

    def source(self, mel: torch.Tensor, generators: Sequence[torch.Generator | None] | None) -> torch.Tensor:
        """The excitation [b, 1, 480 t] for mel [b, 80, t]; each row draws from its own generator (``forward``)."""
        f0 = self.f0_predictor(mel)
        f0 = F.interpolate(f0[:, None], scale_factor=float(SAMPLES_PER_FRAME)).transpose(1, 2)
        if generators is None:
            rand_ini, noise = self.m_source.draw(f0, None)
        else:
            if len(generators) != f0.shape[0]:
                raise ValueError(f"{len(generators)} generators for a batch of {f0.shape[0]}")
            draws = [self.m_source.draw(f0[i : i + 1], g) for i, g in enumerate(generators)]
            rand_ini, noise = (torch.cat(d) for d in zip(*draws, strict=True))
        return self.m_source(f0, rand_ini, noise).transpose(1, 2)

    def decode(self, mel: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Mel [b, 80, t] and source [b, 1, 480 t] -> audio [b, 480 t] in [-0.99, 0.99]."""
        spec = torch.view_as_real(
            torch.stft(s.squeeze(1), N_FFT, HOP, N_FFT, window=self.stft_window, return_complex=True)
        )
        s_stft = torch.cat([spec[..., 0], spec[..., 1]], dim=1)
        x = self.conv_pre(mel)
        n = len(RESBLOCK_KERNELS)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            xs = self.resblocks[i * n](x)
            for j in range(1, n):
                xs += self.resblocks[i * n + j](x)
            x = xs / n
        x = self.conv_post(F.leaky_relu(x))
        magnitude = torch.clip(torch.exp(x[:, : N_FFT // 2 + 1]), max=1e2)
        phase = torch.sin(x[:, N_FFT // 2 + 1 :])
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        audio = torch.istft(spec, N_FFT, HOP, N_FFT, window=self.stft_window)
        return torch.clamp(audio, -AUDIO_LIMIT, AUDIO_LIMIT)

    @torch.inference_mode()
    def forward(
        self,
        mel: torch.Tensor,
        cache_source: torch.Tensor | None = None,
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Audio [b, 480 t] and the source used; ``cache_source`` [b, 1, n] overrides the source's first samples.

        ``generators``: one per row, so that a row of a batch gets the very draws it would get alone; None draws
        the whole batch from the global RNG (the reference's way).
        """
        s = self.source(mel, generators)
        if cache_source is not None and cache_source.shape[2] > 0:
            s[:, :, : cache_source.shape[2]] = cache_source
        return self.decode(mel, s), s
