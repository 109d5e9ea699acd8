"""What a ``/v1/realtime`` connect asks for in its URL's query string (``?model=``, ``?mode=``)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import parse_qs

from django.conf import settings


def _query(scope: dict, name: str) -> str:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return (query.get(name) or [""])[0].strip()


def requested_model(scope: dict) -> str | None:
    return _query(scope, "model")[:100] or settings.PARLEY_DEFAULT_MODEL


def requested_mode(scope: dict) -> Literal["chat"] | None:
    """``?mode=chat`` (extension): a chat client opens without waiting for a slot; other values are ignored
    (the mode is then chosen with ``session.update`` as usual)."""
    return "chat" if _query(scope, "mode") == "chat" else None
