"""``python manage.py exportevalset OUT --user NAME [--filter key=value ...] [--zip]``: an evaluation set.

The selection is the recordings list's, for that user and those filters (the list page's query keys:
``q``, ``label``, ``tag``, ``min_rating``, ``engine``, ``date_from`` ...), so the command sees only what
the user may see. ``OUT`` is a new folder that ``datasets.load_dataset(OUT)`` reads (``export.py``);
with ``--zip`` it is ``OUT.zip`` as well. Prints a progress bar as calls are written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from webapp.common.errors import ApplicationError
from webapp.recordings import export
from webapp.recordings.export_tasks import selection_for

BAR_WIDTH = 30


class Command(BaseCommand):
    help = "Export the recordings a user's filtered list shows as an evaluation set (datasets.load_dataset)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("out", type=Path, help="a new (or empty) folder")
        parser.add_argument("--user", required=True, help="whose view of the recordings to export")
        parser.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE", help="a list-page filter")
        parser.add_argument("--zip", action="store_true", help="also write OUT.zip")

    def handle(self, *args, out: Path, user: str, filter: list[str], zip: bool, **options) -> None:  # noqa: A002
        account = get_user_model().objects.filter(username=user, is_active=True).first()
        if account is None:
            raise CommandError(f"No active user {user!r}.")
        query = {}
        for item in filter:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise CommandError(f"--filter {item!r}: expected KEY=VALUE")
            query[key.strip()] = value
        try:
            rows = selection_for(user=account, query=query)
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        if not rows:
            raise CommandError("No playable recording matches: nothing to export.")
        self.stdout.write(f"exporting {len(rows)} call(s) to {out}")
        try:
            calls = export.build(rows, out, progress=self._bar)
        except export.ExportError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write("")
        if zip:
            export.archive(out, out.with_name(out.name + ".zip"))
        self.stdout.write(self.style.SUCCESS(f"{calls} call(s) written to {out}" + (" (and .zip)" if zip else "")))

    def _bar(self, fraction: float) -> None:
        done = round(BAR_WIDTH * fraction)
        self.stdout.write(f"\r[{'#' * done}{'.' * (BAR_WIDTH - done)}] {fraction:4.0%}", ending="")
        sys.stdout.flush()
