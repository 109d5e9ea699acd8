"""What of a caller's audio may be cut to shrink a standing backlog: only quiet audio, never a word.

``QUIET_RMS`` is the level below which audio counts as quiet (the framer's trims and the WebRTC track's use it).
While the caller speaks, a backlog still goes through the gaps inside their speech: ``cut_gaps`` takes one frame from
a span a little longer than a frame by cutting whole quiet ``GAP_BLOCK_MS`` blocks out of it (the silences between
words and before stops), so the frame stays whole and its words intact.
"""

from __future__ import annotations

import numpy as np

QUIET_RMS = 0.01  # -40 dBFS: below speech, above a quiet room's noise; only audio this quiet is ever trimmed
GAP_BLOCK_MS = 5.0  # the quiet blocks a take may cut from speech to shrink a backlog: shorter than any phoneme


def quiet_blocks(samples: np.ndarray, block: int, quiet_rms: float) -> np.ndarray:
    """Indices of the whole ``block``-sample blocks of ``samples`` whose RMS is below ``quiet_rms``."""
    count = len(samples) // block
    rows = samples[: count * block].reshape(count, block)
    return np.flatnonzero(np.einsum("ij,ij->i", rows, rows) < block * quiet_rms**2)


def cut_gaps(span: np.ndarray, frame: int, block: int, quiet_rms: float) -> tuple[np.ndarray, int] | None:
    """One ``frame``-sample frame from the head of ``span`` (``frame + excess`` samples) with ``d <= excess``
    samples cut out of its quiet blocks: ``(frame, d)``, the frame consuming ``frame + d`` samples of the span; or
    None when no quiet block can be cut.

    Blocks are counted from the head; a block is cut only where all of it falls inside the span the frame
    consumes (a frame that consumes ``k`` more blocks has ``k`` blocks more to find them in). The last block
    cut may be cut in part, so the trim ends exactly where it was meant to. The quiet test is each block's
    RMS, as the whole-trim test is the span's: a block is quiet through, not on average with a loud one.
    """
    excess = len(span) - frame
    quiet = quiet_blocks(span, block, quiet_rms)
    # the largest k whose k-th quiet block ends inside the span a frame with k blocks cut consumes
    cut = 0
    for k in range(min(len(quiet), -(-excess // block)), 0, -1):
        if (quiet[k - 1] + 1) * block <= frame + min(k * block, excess):
            cut = k
            break
    if cut == 0:
        return None
    d = min(cut * block, excess)
    keep = np.ones(frame + d, dtype=bool)
    for i, b in enumerate(quiet[:cut]):
        keep[b * block : b * block + (block if i < cut - 1 else d - (cut - 1) * block)] = False
    return span[: frame + d][keep], d
