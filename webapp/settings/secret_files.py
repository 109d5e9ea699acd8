"""Secrets a settings module needs: a private ``var/``, a generated key kept there, a weak-key check.

``local.py`` uses the generated key so that ``make run`` never serves with a key anyone can read in
the source; ``production.py`` uses the check to refuse a key a person typed in a hurry.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

# Django's own bar for check --deploy (security.W009): long and not a repeated pattern.
MIN_SECRET_LENGTH = 50
MIN_SECRET_UNIQUE_CHARACTERS = 5
_DEVELOPMENT_PREFIXES = ("django-insecure", "parley-insecure")


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if needed and make it 0700: it holds the database and secrets."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def read_or_create_secret(path: Path, *, nbytes: int = 48) -> str:
    """The secret stored in ``path``; a new random one (file mode 0600) when the file is missing."""
    private_dir(path.parent)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    secret = secrets.token_urlsafe(nbytes)
    # O_EXCL: two processes starting at once never overwrite each other's key.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    return secret


def weak_secret_reason(secret: str) -> str | None:
    """Why ``secret`` is not good enough for production, or None when it is."""
    if not secret:
        return "DJANGO_SECRET_KEY is not set"
    if secret.startswith(_DEVELOPMENT_PREFIXES):
        return "DJANGO_SECRET_KEY is a development key"
    if len(secret) < MIN_SECRET_LENGTH or len(set(secret)) < MIN_SECRET_UNIQUE_CHARACTERS:
        return (
            f"DJANGO_SECRET_KEY is too weak: use at least {MIN_SECRET_LENGTH} random characters "
            '(python -c "import secrets; print(secrets.token_urlsafe(50))")'
        )
    return None
