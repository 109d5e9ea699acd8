"""The console's one document: every service, every session and the queue, with names from the web tables.

The console socket, its first paint and the metrics endpoint all read ``console_snapshot``, so
what an admin sees and what Prometheus scrapes come from the same statuses.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from typing import Any

from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from inference import api
from inference.contracts import ParleyError
from webapp.personas.models import Voice

SESSION_STATES = ("active", "paused", "detached", "queued")


async def console_snapshot() -> dict[str, Any]:
    """Services, sessions, queue and totals now; ``unavailable`` says why when the services cannot be read."""
    unavailable = None
    try:
        services = await api.services()
        admission_open = await api.admission_open()
    except ParleyError as exc:
        services, admission_open, unavailable = [], None, exc.message
    sessions = [session for service in services for session in service.sessions]
    usernames, voices = await database_sync_to_async(_names)(
        user_keys={s.user_key for s in sessions}, voice_ids={s.voice for s in sessions if s.voice}
    )
    session_rows = [
        {
            **dataclasses.asdict(s),
            "username": usernames.get(s.user_key, s.user_key),
            "voice_name": voices.get(s.voice or "", s.voice),
        }
        for s in sessions
    ]
    queue = sorted((row for row in session_rows if row["state"] == "queued"), key=_queue_order)
    counts = Counter(s.state for s in sessions)
    return {
        "at": round(time.time(), 3),
        "unavailable": unavailable,
        "admission_open": admission_open,
        "services": [_service_row(service) for service in services],
        "downloads": api.downloads(),
        "sessions": sorted(session_rows, key=lambda row: (row["service_id"], row["username"])),
        "queue": queue,
        "totals": {
            "sessions": {state: counts.get(state, 0) for state in SESSION_STATES},
            "slots_used": sum(s.slots_used for s in services),
            "slots_total": sum(s.slots_total for s in services if s.state != "down"),
            "capacity": sum(capacity_of(s) for s in services if s.state != "down"),
            "queue_length": sum(s.queue_length for s in services),
            "services": dict(Counter(s.state for s in services)),
            "admissions_refused": dict(api.admissions_refused),
        },
    }


def capacity_of(service: api.ServiceStatus) -> int:
    """The sessions the service's engine reports it admits at its call mix (its slots for an older service)."""
    return int(service.capacity.get("call_mix", service.slots_total))


def _service_row(service: api.ServiceStatus) -> dict[str, Any]:
    row = dataclasses.asdict(service)
    row["capacity"] = {**service.capacity, "call_mix": capacity_of(service)}
    del row["sessions"]  # listed once, in the session table
    row["session_count"] = len(service.sessions)
    return row


def _queue_order(row: dict[str, Any]) -> tuple:
    return (row["estimated_wait_s"] or 0.0, row["service_id"], row["queue_position"] or 0)


def _names(*, user_keys: set[str], voice_ids: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """user_key -> username (the consumer's user_key is the user's pk) and voice id -> voice name."""
    user_pks = [int(key) for key in user_keys if key.isdigit()]
    users = get_user_model().objects.filter(pk__in=user_pks).values_list("pk", "username")
    voice_pks = [int(v) for v in voice_ids if v.isdigit()]
    voices = Voice.objects.filter(pk__in=voice_pks).values_list("pk", "name")
    return {str(pk): name for pk, name in users}, {str(pk): name for pk, name in voices}
