"""Where the framer may end a frame: at the end of a client's piece that came early enough before the tick.

A frame that ends inside a piece holds that piece's first samples back for the rest of it (the client cut the piece
later), and is short whenever that piece is late; so the framer's trims (``inference.audio.framing``) land frames on
piece ends. ``pushes`` is the framer's record of them: (stream position after a push, monotonic time of the push),
in stream order. Both functions return how many samples beyond ``end`` (the stream position the latest frame ended
at) the chosen piece end lies.
"""

from __future__ import annotations

from collections.abc import Iterable


def newest_end_before(pushes: Iterable[tuple[int, float]], end: int, now: float, lead_s: float) -> int:
    """The newest piece end beyond ``end`` whose piece came at least ``lead_s`` before ``now``; 0 when none did."""
    best = 0
    for boundary, pushed_at in pushes:
        if boundary > end and now - pushed_at >= lead_s:
            best = boundary - end  # pushes are in stream order: a later qualifying one replaces it
    return best


def aligned_end(
    pushes: Iterable[tuple[int, float]], end: int, within: int, newest_at: float, lead_s: float, margin_s: float
) -> int | None:
    """The newest piece end at most ``within`` samples beyond ``end`` that keeps its frames ``margin_s`` early.

    Had the frame ended at the end ``B`` of a buffered push instead, its last sample would have arrived
    ``lead_s + (newest_at - t_B)`` before the tick, ``lead_s`` being the newest push's lead over the takes that
    count (the window's worst, or nearly); pieces that come as regularly as the ticks keep that phase, so dropping
    ``B - end`` samples makes the following frames end at piece ends too. 0 when the frame already ends at the one
    chosen; None when no piece end will do.
    """
    best = None
    for boundary, pushed_at in pushes:
        if boundary < end or boundary - end > within:
            continue
        if lead_s + (newest_at - pushed_at) >= margin_s:
            best = boundary - end  # pushes are in stream order: a later qualifying one replaces it
    return best
