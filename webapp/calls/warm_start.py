"""Warm start: as the web process starts, the in-process engine loads and the call page's default start
(the default persona, the engine's default voice) is prepared in the background, so the first call is live
at once. ``PARLEY_WARM_START`` (auto, off) turns it off; the call page says "Getting the agent ready…" while
``inference.api.warm_start_status`` says warming."""

from __future__ import annotations

from django.conf import settings

from inference import api
from webapp.calls.views import DEFAULT_PERSONA


def begin_warm_start() -> bool:
    """Begin it unless the settings say off; never blocks (False: nothing to warm here, or off)."""
    if settings.PARLEY_WARM_START == "off":
        return False
    return api.warm_start(persona=DEFAULT_PERSONA)
