"""Internal errors of the inference service. Protocol errors are ``contracts.ParleyError``."""

from __future__ import annotations


class EngineNotAvailable(RuntimeError):
    """The configured engine name is unknown, or its module is not installed yet."""


class WireError(Exception):
    """A malformed frame on the service socket; the connection is dropped, nothing else."""
