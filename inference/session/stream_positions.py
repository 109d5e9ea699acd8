"""Where one session's audio stands, in samples, so that a Metrics event can name one tick exactly.

Input goes to the worker as it comes; the worker's framer cuts frames in phase with the tick. A tick
reports how far into the input stream it had heard; paired with how much output the current
connection had been sent by then, the page measures mouth-to-ear from it.
"""

from __future__ import annotations

from inference.audio.phase_advice import PhaseAdvice


class StreamPositions:
    """Input and output sample positions of one session, relative to its current connection.

    Args:
        engine_rate: the engine's input rate; positions are kept at that rate.
    """

    def __init__(self, engine_rate: int):
        self.engine_rate = engine_rate
        self.pushed = 0  # input samples handed to the worker (engine rate): the stream position
        self.input_rate = engine_rate  # the client's rate, to give positions in its own samples
        self._attached_at = 0  # stream position when the current connection attached
        self._sent_samples = 0  # output samples handed to the current connection
        self._heard: tuple[int, int] | None = None  # latest tick: (stream position heard, output samples sent)

    def attached(self) -> None:
        """A new connection: its positions count from here."""
        self._attached_at, self._sent_samples, self._heard = self.pushed, 0, None

    def sent(self, samples: int, heard_position: int | None) -> None:
        """``samples`` output samples went to the connection; the tick behind them had heard up to ``heard_position``."""
        self._sent_samples += samples
        if heard_position is not None:
            self._heard = (heard_position, self._sent_samples)

    def heard_fields(self) -> dict[str, float]:
        """The latest tick's pair for Metrics, once it heard this connection's input; else nothing."""
        if self._heard is None or self._heard[0] <= self._attached_at:
            return {}
        # One tick, exactly: it had heard this connection's input up to heard_input_samples (the
        # client's rate) and its audio ends at heard_output_samples of what this connection got.
        heard, sent = self._heard
        return {
            "heard_input_samples": round((heard - self._attached_at) * self.input_rate / self.engine_rate),
            "heard_output_samples": sent,
        }

    def advice_fields(self, advice: PhaseAdvice | None) -> dict[str, float]:
        """The framer's phase advice for Metrics, once measured on this connection's input; else nothing.

        ``input_shift_from_samples`` is where (in this connection's input, the client's rate) the audio the
        advice was measured on began: a client that moved its cut after that point skips it as stale.
        """
        if advice is None or advice.from_position <= self._attached_at:
            return {}
        return {
            "input_shift_ms": advice.shift_ms,
            "input_shift_from_samples": round(
                (advice.from_position - self._attached_at) * self.input_rate / self.engine_rate
            ),
        }
