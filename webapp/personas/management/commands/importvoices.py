"""``python manage.py importvoices PATH``: built-in voices from a folder or a ``.tgz``.

PersonaPlex voice ``.pt`` files are loaded with ``weights_only=True`` and stored as safetensors; audio clips go
through the same pipeline as a cloned voice (decoded, trimmed, normalised, validated, prompts computed). A
``.tgz`` is read member by member and never extracted: entries with absolute or ``..`` paths, links and
anything but regular files are refused. Only one member's bytes are held at a time: a first pass reads the
archive's headers (at most ``MAX_ENTRIES`` of them; each member at most the upload limit), then each member is
read, imported and let go before the next, so a small archive of many well-compressed members cannot fill
memory. Prints a progress bar and a summary of what was imported and what was refused, and why.
"""

from __future__ import annotations

import contextlib
import tarfile
import zlib
from collections.abc import Callable, Iterator
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
MAX_ENTRIES = 1000  # a voice pack holds tens; an archive of more is refused before anything is imported


@dataclass
class Entry:
    """One candidate file: its name in the source, and either how to read its bytes or why it is refused."""

    name: str
    read: Callable[[], bytes] | None = None
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
        imported: list[str] = []
        refused: list[tuple[str, str]] = []
        with self._entries(path) as entries:
            if not entries:
                raise CommandError(f"{path}: no .pt or audio files found")
            for index, entry in enumerate(entries, start=1):
                reason = entry.refused or self._read_and_import(entry, owner_user)
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

    @contextlib.contextmanager
    def _entries(self, path: Path) -> Iterator[list[Entry]]:
        """The candidate files, each read only when imported (the archive stays open until then)."""
        if path.is_dir():
            yield self._folder_entries(path)
        elif tarfile.is_tarfile(path):
            with contextlib.ExitStack() as stack:
                try:
                    tar = stack.enter_context(tarfile.open(path, "r:*"))
                    entries = self._tar_entries(tar, path)
                except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
                    raise CommandError(f"{path}: not a readable archive ({exc})") from exc
                yield entries
        else:
            raise CommandError(f"{path}: not a folder or a .tgz archive")

    def _folder_entries(self, folder: Path) -> list[Entry]:
        limit = api.voice_limits()["max_bytes"]
        entries = []
        for path in sorted(folder.rglob("*")):
            name = str(path.relative_to(folder))
            if path.is_symlink():
                entries.append(Entry(name, refused="a symlink (refused: it could point anywhere)"))
            elif path.is_file() and path.suffix.lower() in AUDIO_SUFFIXES | PROMPT_SUFFIXES:
                if path.stat().st_size > limit:
                    entries.append(Entry(name, refused=f"larger than {limit // (1024 * 1024)} MB"))
                else:
                    entries.append(Entry(name, read=path.read_bytes))
        return entries

    def _tar_entries(self, tar: tarfile.TarFile, archive: Path) -> list[Entry]:
        """The members' headers only (no member's bytes are read here), at most ``MAX_ENTRIES`` of them."""
        limit = int(api.voice_limits()["max_bytes"])
        entries = []
        for count, member in enumerate(tar, start=1):
            if count > MAX_ENTRIES:
                raise CommandError(f"{archive}: more than {MAX_ENTRIES} entries; refused (a voice pack holds far fewer)")
            parts = PurePosixPath(member.name).parts
            if member.name.startswith("/") or ".." in parts:
                entries.append(Entry(member.name, refused="path traversal (absolute or '..' path)"))
            elif member.issym() or member.islnk():
                entries.append(Entry(member.name, refused="a link (refused: it could point anywhere)"))
            elif not member.isfile():
                continue  # folders
            elif PurePosixPath(member.name).suffix.lower() not in AUDIO_SUFFIXES | PROMPT_SUFFIXES:
                entries.append(Entry(member.name, refused="not a .pt or audio file"))
            elif member.size > limit:
                entries.append(Entry(member.name, refused=f"larger than {limit // (1024 * 1024)} MB"))
            else:
                entries.append(Entry(member.name, read=lambda member=member: _read_member(tar, member, limit)))
        return entries

    # ---- importing one ----------------------------------------------------------------------------------

    def _read_and_import(self, entry: Entry, owner) -> str | None:
        try:
            data = entry.read()
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            return f"cannot be read ({exc})"
        return self._import(entry.name, data, owner)  # the bytes are let go when it returns

    def _import(self, source_name: str, data: bytes, owner) -> str | None:
        """Import one file; returns why it was refused, or None. A refused file leaves no row behind."""
        name = PurePosixPath(source_name).stem[:100]
        suffix = PurePosixPath(source_name).suffix.lower()
        try:
            services.voice_check_name(owner=owner, name=name)
        except services.VoiceError as exc:
            return f"duplicate name: {exc}"
        if suffix in PROMPT_SUFFIXES:
            try:
                blob = api.convert_voice_prompt_pt(data)
            except ParleyError as exc:
                return exc.message
            with transaction.atomic():
                voice = Voice.objects.create(owner=owner, name=name, kind=Voice.Kind.BUILTIN, status=Voice.Status.READY,
                                             progress_stage="ready", progress_percent=100)  # fmt: skip
                services.voice_store_prompt(voice, family="lockstep", model_key="personaplex-pt", blob=blob)
            return None
        try:
            header = api.probe_voice_clip(data)  # from the header: nothing decoded, nothing stored yet
        except ParleyError as exc:
            return exc.message
        voice = Voice(owner=owner, name=name, kind=Voice.Kind.BUILTIN)
        voice.save()
        voice.reference_audio.save("clip" + header.extension, ContentFile(data), save=True)
        if services.voice_process(voice_id=voice.pk) == "ready":
            return None
        voice.refresh_from_db()
        reason = voice.failure_reason
        voice.reference_audio.delete(save=False)
        voice.delete()
        return reason


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> bytes:
    """One member's bytes, never more than ``limit`` (in memory; nothing is written to disk)."""
    handle = tar.extractfile(member)
    return handle.read(limit + 1) if handle else b""
