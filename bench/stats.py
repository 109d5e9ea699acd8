"""The one summary of a list of timings that every benchmark reports: count, percentiles, maximum.

Each benchmark keeps its own key names in its results (``p50_ms``, ``median``, ``ticks`` ...), so older result
files stay comparable; only the arithmetic lives here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def summary(
    values: Sequence[float] | np.ndarray,
    quantiles: Sequence[int] = (50, 99),
    *,
    suffix: str = "",
    digits: int | None = None,
    median: bool = False,
    count: str | None = "n",
) -> dict[str, float | int]:
    """``{count: n, "p<q><suffix>": ..., "max<suffix>": ...}``; ``median`` names the 50th ``median<suffix>``;
    ``digits`` rounds; ``count=None`` leaves the count out. No values: only the count (or nothing)."""
    a = np.asarray(values, dtype=float).reshape(-1)
    out: dict[str, float | int] = {} if count is None else {count: int(a.size)}
    if a.size == 0:
        return out

    def fmt(x: float) -> float:
        return float(x) if digits is None else round(float(x), digits)

    for q, v in zip(quantiles, np.percentile(a, list(quantiles)), strict=True):
        out[("median" if median and q == 50 else f"p{q}") + suffix] = fmt(v)
    out["max" + suffix] = fmt(a.max())
    return out
