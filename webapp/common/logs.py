"""Log formats: JSON lines in production (python-json-logger), a readable console line for ``make run``.

Both print the ``extra={...}`` fields that calls pass (``session_id``, ``reason``, ...), which the plain
``logging.Formatter`` drops: JSON as fields of the record's object, the console as ``key=value`` after the message.
"""

from __future__ import annotations

import logging

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class ConsoleFormatter(logging.Formatter):
    """``time LEVEL logger message key=value ...`` for a person reading a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        return line + "".join(f" {k}={v!r}" for k, v in extras.items())


def logging_config(*, json_lines: bool) -> dict:
    """Django's ``LOGGING``: JSON lines (production) or the console format, at INFO for our own packages."""
    formatter = (
        {"()": "pythonjsonlogger.json.JsonFormatter", "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s"}
        if json_lines
        else {"()": "webapp.common.logs.ConsoleFormatter"}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"parley": formatter},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "parley"}},
        "root": {"handlers": ["console"], "level": "WARNING"},
        "loggers": {"webapp": {"level": "INFO"}, "inference": {"level": "INFO"}},
    }
