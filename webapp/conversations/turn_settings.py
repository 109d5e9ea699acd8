"""What a ``session.update`` asks of the session's mode and turn detection (validation only).

The mode is ``session.duplex.mode`` when given. A stock client does not know that extension: on an
engine that serves half-duplex, a ``turn_detection`` of type ``server_vad`` selects it. On a duplex-only
engine ``turn_detection`` is ignored, as before, so stock clients that send their usual session still work;
only an explicit ``duplex.mode`` the engine does not serve is refused (``unsupported_mode``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from inference.contracts import Mode, TurnDetection
from webapp.conversations import protocol as p
from webapp.conversations.server_events import SessionView


@dataclass(frozen=True)
class TurnUpdate:
    mode: Mode | None
    detection: TurnDetection | None
    max_response_s: int | None

    def apply(self, view: SessionView) -> None:
        """Mirror what the session accepted in the session object."""
        view.mode = self.mode or view.mode
        view.turn_detection = (
            None if self.detection is None else {"type": "server_vad", **dataclasses.asdict(self.detection)}
        )
        if self.max_response_s is not None:
            view.max_response_s = self.max_response_s


def turn_update(config: p.SessionConfig, view: SessionView) -> TurnUpdate | None:
    """The mode change to hand the session, or None when the update leaves turns alone."""
    caps = view.capabilities
    named, settings = p.turn_settings(config, served=caps is None or "half_duplex" in caps.modes)
    duplex = config.duplex
    mode = duplex.mode if duplex is not None else None
    max_response_s = duplex.max_response_s if duplex is not None else None
    if mode is not None and caps is not None and mode not in caps.modes:
        raise p.ProtocolError(
            "unsupported_mode",
            f"The {caps.engine} engine serves the modes {list(caps.modes)}, not {mode!r}.",
            param="session.duplex.mode",
        )
    serves_half_duplex = caps is not None and "half_duplex" in caps.modes
    if mode is None and named and settings is not None and serves_half_duplex and view.mode == "duplex":
        mode = "half_duplex"
    target = mode or view.mode
    if target == "chat":  # no turn detection; max_response_s caps each reply
        return TurnUpdate(mode, None, max_response_s) if mode is not None or max_response_s is not None else None
    if target != "half_duplex":
        if mode is None:
            return None  # duplex sessions take no turn detection
        return TurnUpdate(mode, None, None)
    if named:
        detection = None if settings is None else TurnDetection(**settings.model_dump(exclude={"type"}))
    elif view.mode == "half_duplex":
        detection = _current(view)
    else:
        detection = TurnDetection()  # half-duplex chosen without settings: OpenAI's server_vad defaults
    if mode is None and not named and max_response_s is None:
        return None
    return TurnUpdate(mode, detection, max_response_s)


def _current(view: SessionView) -> TurnDetection | None:
    if view.turn_detection is None:
        return None
    return TurnDetection(**{k: v for k, v in view.turn_detection.items() if k != "type"})
