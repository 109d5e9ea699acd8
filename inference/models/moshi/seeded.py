"""Seeded random weights that come out bit-identical on every x86-64 CPU.

``torch.randn`` draws normals with a vectorised Box-Muller whose log/sin/cos differ in their last bits between
CPU kernels (AVX-512, AVX2, the portable one of ``ATEN_CPU_CAPABILITY=default``), so a tiny checkpoint made
from a seed was not the same file on every machine, and reference goldens of it could not be checked on another
one. Uniform draws are exact (24 random bits times 2**-24), and so are the elementwise sums and products here.
"""

from __future__ import annotations

import math

import torch


def unit_noise(shape: tuple[int, ...] | torch.Size, generator: torch.Generator) -> torch.Tensor:
    """float32 noise of mean 0 and variance 1, bell-shaped: the sum of 4 uniforms, centred and scaled
    (Irwin-Hall), instead of ``torch.randn``."""
    total = torch.rand(shape, generator=generator)
    for _ in range(3):
        total = total + torch.rand(shape, generator=generator)
    return (total - 2.0) * math.sqrt(3.0)
