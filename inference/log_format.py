"""Log formats of the inference service process: JSON lines in production (python-json-logger,
``PARLEY_LOG_JSON=1``), a readable console line otherwise. Both print the ``extra={...}`` fields
(``session_id``, ``reason``, ...) that the plain ``logging.Formatter`` drops. (The web tier's
twin is ``webapp/common/logs.py``: each side of the seam configures its own process.)
"""

from __future__ import annotations

import logging

from pythonjsonlogger.json import JsonFormatter

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class ConsoleFormatter(logging.Formatter):
    """``time LEVEL logger message key=value ...`` for a person reading a terminal."""

    def __init__(self) -> None:
        super().__init__(FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        return line + "".join(f" {k}={v!r}" for k, v in extras.items())


def configure_logging(*, json_lines: bool, level: int = logging.INFO) -> None:
    """Root logging for the service process (replaces any handlers set before)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(FORMAT) if json_lines else ConsoleFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
