"""Lookups the occupancy view needs from the web tier's own tables."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from inference.contracts import WorkerSnapshot


def usernames_for_slots(*, snapshots: list[WorkerSnapshot]) -> dict[str, str]:
    """user_key -> username for every occupied slot (the consumer uses the user's pk as user_key)."""
    keys = {slot.user_key for snap in snapshots for slot in snap.slots if slot.user_key}
    pks = [int(key) for key in keys if key.isdigit()]
    users = get_user_model().objects.filter(pk__in=pks).values_list("pk", "username")
    return {str(pk): username for pk, username in users}
