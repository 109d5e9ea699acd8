"""A session's engine output on its way to the connection: each tick's audio, text and listen/speak decision.

Kept apart from ``inference.session.dialogue``, which owns the session's state (a tick's output also moves it
from prefilling to live). This owns what one tick's output becomes for the connection, in its order: the
agent's audio (counted, for the stream positions and the echo watch), its text, the numbered listen/speak
decision, and then the half-duplex turn's look at the unit. Under test-only jitter
(``inference.session.output_jitter``) it all goes out later, still in order.
"""

from __future__ import annotations

from collections.abc import Callable

from inference.contracts import AudioOut, Decision, SessionEvent, TextOut
from inference.engines.base import SlotOutput
from inference.session.echo_watch import EchoWatch
from inference.session.output_jitter import OutputJitter
from inference.session.stream_positions import StreamPositions
from inference.turns.session_modes import TurnModes


class TickOutput:
    """One session's outgoing engine output.

    Args:
        output_rate: the engine's output rate, to count the audio sent in ms.
        positions: the session's stream positions (the output samples sent go there).
        echo: the session's echo watch (it hears the agent's audio as sent).
        emit: the session's way to its connection.
        modes: the session's modes (half-duplex looks at each unit's output after it went out).
        jitter: test-only output jitter; None: none.
    """

    def __init__(
        self,
        output_rate: int,
        positions: StreamPositions,
        echo: EchoWatch,
        emit: Callable[[SessionEvent], None],
        modes: TurnModes,
        jitter: OutputJitter | None = None,
    ):
        self._output_rate, self._positions, self._echo = output_rate, positions, echo
        self._emit, self._modes = emit, modes
        self._jitter = jitter
        self.unit = 0
        self.sent_audio_ms = 0.0

    def send(self, output: SlotOutput, pcm16: bytes, heard_position: int | None, epoch: int) -> None:
        """One tick's output for the connection (``heard_position``: where the input stood for that tick)."""
        if pcm16:
            self.sent_audio_ms += 1000.0 * len(pcm16) / 2 / self._output_rate
            self._send_output(self._send_audio, pcm16, heard_position, epoch)
        if output.text:
            self._send_output(self._emit, TextOut(output.text, epoch))
        if output.decision is not None:
            self._send_output(self._emit, Decision(output.decision, self.unit, output.end_of_turn))
            self.unit += 1
        if self._modes.turns is not None:  # half-duplex: after the unit's output, in its order
            self._send_output(self._modes.turns.on_output, output)

    def cancel(self) -> None:
        """The session closed: output still held back by the jitter is dropped."""
        if self._jitter is not None:
            self._jitter.cancel()

    def _send_output(self, send: Callable[..., None], *args: object) -> None:
        """A tick's output goes to the connection at once (or, under test-only jitter, later and in order)."""
        if self._jitter is None:
            send(*args)
        else:
            self._jitter.send(lambda: send(*args))

    def _send_audio(self, pcm16: bytes, heard_position: int | None, epoch: int) -> None:
        self._positions.sent(len(pcm16) // 2, heard_position)
        self._echo.agent(pcm16)
        self._emit(AudioOut(pcm16, epoch))
