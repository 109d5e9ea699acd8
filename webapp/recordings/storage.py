"""Where finished recordings live: the ``recordings`` entry of ``settings.STORAGES``.

Local files in the embedded default, an S3-compatible bucket in production (``django-storages``);
everything here goes through Django's storage API, so both behave the same.
"""

from __future__ import annotations

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages

STORAGE_ALIAS = "recordings"


def recordings_storage() -> Storage:
    return storages[STORAGE_ALIAS]


def file_name(*, user_id: int, session_id: str, filename: str) -> str:
    return f"recordings/{user_id}/{session_id}/{filename}"


def save(name: str, content: bytes) -> str:
    """Store ``content`` under exactly ``name`` (a retry overwrites its own earlier attempt)."""
    storage = recordings_storage()
    if storage.exists(name):
        storage.delete(name)
    return storage.save(name, ContentFile(content))


def delete_all(names: list[str]) -> None:
    storage = recordings_storage()
    for name in names:
        storage.delete(name)  # missing files are fine: deleting twice is not an error
