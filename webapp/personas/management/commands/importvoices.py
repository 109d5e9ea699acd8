"""``python manage.py importvoices PATH``: built-in voices from a folder or a ``.tgz``.

PersonaPlex voice ``.pt`` files are loaded with ``weights_only=True`` and stored as safetensors; audio clips go
through the same pipeline as a cloned voice (decoded, trimmed, normalised, validated, prompts computed). A
``.tgz`` is read member by member and never extracted: entries with absolute or ``..`` paths, links and
anything but regular files are refused. Prints a progress bar and a summary of what was imported and what was
refused, and why.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from django.contrib.auth import get_user_model
from django.core.files.base import ContentFile
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from inference import api
from inference.contracts import ParleyError
from webapp.personas import services
from webapp.personas.models import Voice

AUDIO_SUFFIXES = {".wav", ".flac", ".ogg", ".opus", ".webm", ".mp3", ".m4a"}
PROMPT_SUFFIXES = {".pt"}
BAR_WIDTH = 30


@dataclass
class Entry:
    """One candidate file: its name in the source, and either its bytes or why it cannot be read."""

    name: str
    data: bytes | None = None
    refused: str | None = None


class Command(BaseCommand):
    help = "Import built-in voices (PersonaPlex .pt prompts or audio clips) from a folder or a .tgz."

    def add_arguments(self, parser) -> None:
        parser.add_argument("path", type=Path)
        parser.add_argument("--owner", help="username owning the voices (default: shared with every user)")

    def handle(self, *args, path: Path, owner: str | None, **options) -> None:
        owner_user = None
        if owner:
            owner_user = get_user_model().objects.filter(username=owner).first()
            if owner_user is None:
                raise CommandError(f"no user named {owner!r}")
        if not path.exists():
            raise CommandError(f"{path} does not exist")
        entries = list(self._entries(path))
        if not entries:
            raise CommandError(f"{path}: no .pt or audio files found")
        imported: list[str] = []
        refused: list[tuple[str, str]] = []
        for index, entry in enumerate(entries, start=1):
            reason = entry.refused or self._import(entry, owner_user)
            if reason is None:
                imported.append(entry.name)
            else:
                refused.append((entry.name, reason))
            done = BAR_WIDTH * index // len(entries)
            outcome = "imported" if reason is None else "refused"
            self.stdout.write(f"[{'#' * done}{'.' * (BAR_WIDTH - done)}] {index}/{len(entries)} {entry.name}: {outcome}")
        self.stdout.write(self.style.SUCCESS(f"Imported {len(imported)}: {', '.join(imported) or '-'}"))
        if refused:
            self.stdout.write(self.style.WARNING(f"Refused {len(refused)}:"))
            for name, reason in refused:
                self.stdout.write(f"  {name}: {reason}")

    # ---- reading the source ---------------------------------------------------------------------------

    def _entries(self, path: Path) -> Iterator[Entry]:
        if path.is_dir():
            yield from self._folder_entries(path)
        elif tarfile.is_tarfile(path):
            yield from self._tar_entries(path)
        else:
            raise CommandError(f"{path}: not a folder or a .tgz archive")

    def _folder_entries(self, folder: Path) -> Iterator[Entry]:
        limit = api.voice_limits()["max_bytes"]
        for path in sorted(folder.rglob("*")):
            name = str(path.relative_to(folder))
            if path.is_symlink():
                yield Entry(name, refused="a symlink (refused: it could point anywhere)")
            elif path.is_file() and path.suffix.lower() in AUDIO_SUFFIXES | PROMPT_SUFFIXES:
                if path.stat().st_size > limit:
                    yield Entry(name, refused=f"larger than {limit // (1024 * 1024)} MB")
                else:
                    yield Entry(name, data=path.read_bytes())

    def _tar_entries(self, archive: Path) -> Iterator[Entry]:
        limit = api.voice_limits()["max_bytes"]
        try:
            with tarfile.open(archive, "r:*") as tar:
                for member in tar:
                    parts = PurePosixPath(member.name).parts
                    if member.name.startswith("/") or ".." in parts:
                        yield Entry(member.name, refused="path traversal (absolute or '..' path)")
                    elif member.issym() or member.islnk():
                        yield Entry(member.name, refused="a link (refused: it could point anywhere)")
                    elif not member.isfile():
                        continue  # folders
                    elif PurePosixPath(member.name).suffix.lower() not in AUDIO_SUFFIXES | PROMPT_SUFFIXES:
                        yield Entry(member.name, refused="not a .pt or audio file")
                    elif member.size > limit:
                        yield Entry(member.name, refused=f"larger than {limit // (1024 * 1024)} MB")
                    else:
                        handle = tar.extractfile(member)  # read in memory; nothing is written to disk
                        yield Entry(member.name, data=handle.read() if handle else b"")
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise CommandError(f"{archive}: not a readable archive ({exc})") from exc

    # ---- importing one ----------------------------------------------------------------------------------

    def _import(self, entry: Entry, owner) -> str | None:
        """Import one entry; returns why it was refused, or None. A refused entry leaves no row behind."""
        name = PurePosixPath(entry.name).stem[:100]
        suffix = PurePosixPath(entry.name).suffix.lower()
        try:
            services.voice_check_name(owner=owner, name=name)
        except services.VoiceError as exc:
            return f"duplicate name: {exc}"
        if suffix in PROMPT_SUFFIXES:
            try:
                blob = api.convert_voice_prompt_pt(entry.data or b"")
            except ParleyError as exc:
                return exc.message
            with transaction.atomic():
                voice = Voice.objects.create(owner=owner, name=name, kind=Voice.Kind.BUILTIN, status=Voice.Status.READY,
                                             progress_stage="ready", progress_percent=100)  # fmt: skip
                services.voice_store_prompt(voice, family="lockstep", model_key="personaplex-pt", blob=blob)
            return None
        try:
            header = api.probe_voice_clip(entry.data or b"")  # from the header: nothing decoded, nothing stored yet
        except ParleyError as exc:
            return exc.message
        voice = Voice(owner=owner, name=name, kind=Voice.Kind.BUILTIN)
        voice.save()
        voice.reference_audio.save("clip" + header.extension, ContentFile(entry.data or b""), save=True)
        if services.voice_process(voice_id=voice.pk) == "ready":
            return None
        voice.refresh_from_db()
        reason = voice.failure_reason
        voice.reference_audio.delete(save=False)
        voice.delete()
        return reason
