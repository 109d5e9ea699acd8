"""A checkpoint named by hub repository id (``org/name`` or ``org/name@revision``) resolved to a local folder.

huggingface_hub fetches only what the engine reads: ``config.json`` first (it names the family and the weight
files), then that family's files by ``allow_patterns``; downloads resume, ``HF_TOKEN`` opens gated
repositories, a revision pins the snapshot, and ``HF_HUB_OFFLINE`` resolves from the cache alone. Each file the
family needs is then checked to be there, so a partial cache fails here, naming the file, not deep in a load.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path

from inference.config import HubAccess

logger = logging.getLogger(__name__)

# org/name[@revision]: the hub's own name rules (letters, digits, - _ .), a revision a branch, tag or commit
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?$")
CONFIG = "config.json"
VOICE_PATTERNS = ["voices.tgz", "voices.tar.gz", "voices/*"]
MINICPMO_PATTERNS = [
    "config.json", "generation_config.json", "model.safetensors", "model*.safetensors",
    "model.safetensors.index.json", "vocab.json", "merges.txt", "tokenizer_config.json", "tokenizer.json",
    "added_tokens.json", "special_tokens_map.json", "preprocessor_config.json", "assets/token2wav/*",
]  # fmt: skip


class HubError(ValueError):
    """A hub id that cannot be resolved: not in the cache offline, a missing file, no access; names the file."""


def is_hub_id(value: str | Path) -> bool:
    """``org/name[@rev]`` that is not an existing local path (a relative folder ``a/b`` that exists wins)."""
    text = str(value)
    return bool(HUB_ID.match(text)) and not Path(text).exists()


def split_id(value: str) -> tuple[str, str | None]:
    match = HUB_ID.match(value)
    if match is None:
        raise HubError(f"{value!r} is not a hub repository id (org/name or org/name@revision)")
    return match["repo"], match["revision"]


def resolve_checkpoint(value: str | Path, access: HubAccess | None = None) -> Path:
    """A local folder for ``value``: itself when it is a folder, else the hub snapshot of that id.

    Raises:
        HubError: the id cannot be fetched (offline and not cached, gated without a token, unknown), or the
            snapshot lacks a file the family needs (named).
    """
    if not is_hub_id(value):
        return Path(value)
    access = access or HubAccess.from_env()
    repo, revision = split_id(str(value))
    first = _snapshot(repo, revision, [CONFIG], access, required=False)
    patterns = _family_patterns(first)
    folder = _snapshot(repo, revision, patterns, access, required=True)
    missing = [name for name in required_files(folder) if not (folder / name).is_file()]
    if missing:
        where = "the cache (offline)" if access.offline else "the snapshot"
        raise HubError(f"{repo}@{revision or 'main'}: {missing[0]} is missing from {where}"
                       + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))  # fmt: skip
    logger.info("hub.resolved", extra={"repo": repo, "revision": revision or "main", "folder": str(folder)})
    return folder


def _family_patterns(folder: Path) -> list[str]:
    """What to fetch once ``config.json`` (or its absence: a legacy Kyutai repository) is known."""
    from inference.models.moshi.config import MIMI_NAME, MOSHI_NAME, TEXT_TOKENIZER_NAME

    config = folder / CONFIG
    raw = _json(config) if config.is_file() else None
    if raw is not None and (raw.get("model_type") == "minicpmo" or "MiniCPMO" in raw.get("architectures", [])):
        return MINICPMO_PATTERNS
    raw = raw or {}
    names = [raw.get("moshi_name", MOSHI_NAME), raw.get("mimi_name", MIMI_NAME),
             raw.get("tokenizer_name", TEXT_TOKENIZER_NAME), raw.get("mimi_config_name")]  # fmt: skip
    return [CONFIG, *(n for n in names if isinstance(n, str) and n), *VOICE_PATTERNS]


def required_files(folder: Path) -> list[str]:
    """Files the folder's family cannot serve without (weights, codec, tokenizer; shards of an index)."""
    from inference.models.moshi.config import MIMI_NAME, MOSHI_NAME, TEXT_TOKENIZER_NAME

    raw = _json(folder / CONFIG) if (folder / CONFIG).is_file() else None
    if raw is not None and (raw.get("model_type") == "minicpmo" or "MiniCPMO" in raw.get("architectures", [])):
        names = ["vocab.json", "merges.txt", "tokenizer_config.json"]
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = (_json(index) or {}).get("weight_map", {})
            return [*names, *sorted(set(weight_map.values()) if isinstance(weight_map, dict) else [])]
        return [*names, "model.safetensors"]
    raw = raw or {}
    names = [raw.get("moshi_name", MOSHI_NAME), raw.get("mimi_name", MIMI_NAME),
             raw.get("tokenizer_name", TEXT_TOKENIZER_NAME), raw.get("mimi_config_name")]  # fmt: skip
    return [n for n in names if isinstance(n, str) and n]


def _snapshot(repo: str, revision: str | None, patterns: list[str], access: HubAccess, *, required: bool) -> Path:
    logger.info("hub.fetch", extra={"repo": repo, "revision": revision or "main", "files": patterns,
                                    "offline": access.offline})  # fmt: skip
    if not access.offline:
        DOWNLOADS.begin(repo)
    try:
        path = _fetch(repo, revision, patterns, access)
    except HubError:
        DOWNLOADS.end(repo, "failed")
        raise
    DOWNLOADS.end(repo, "done")
    return Path(path)


def _fetch(repo: str, revision: str | None, patterns: list[str], access: HubAccess) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return snapshot_download(
            repo,
            revision=revision,
            allow_patterns=patterns,
            token=access.token,
            cache_dir=str(access.cache_dir) if access.cache_dir else None,
            local_files_only=access.offline,
            endpoint=access.endpoint,
            tqdm_class=_progress_class(repo),
        )
    except GatedRepoError as exc:
        raise HubError(f"{repo} is gated: accept its licence on the hub and set HF_TOKEN ({exc})") from None
    except RepositoryNotFoundError as exc:
        raise HubError(f"{repo}: no such repository, or HF_TOKEN has no access ({exc})") from None
    except LocalEntryNotFoundError:
        how = "HF_HUB_OFFLINE is set" if access.offline else "the hub cannot be reached"
        raise HubError(f"{repo}@{revision or 'main'} is not in the hub cache ({access.cache_dir or 'default'}) "
                       f"and {how}") from None  # fmt: skip
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise HubError(f"{repo}@{revision or 'main'}: {exc}") from None


class Downloads:
    """The hub downloads of this process, as the log and the console show them: per repository, bytes and files
    done of their totals, and whether it is still going. huggingface_hub's progress bars feed it (``_progress_class``);
    ``inference.api.downloads()`` hands it to the console."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._repos: dict[str, dict] = {}

    def begin(self, repo: str) -> None:
        with self._lock:
            self._repos[repo] = {"repo": repo, "state": "downloading", "bytes_done": 0, "bytes_total": 0,
                                 "files_done": 0, "files_total": 0, "at": time.time()}  # fmt: skip

    def note(self, repo: str, **counts: int) -> None:
        with self._lock:
            entry = self._repos.get(repo)
            if entry is not None:
                for key, value in counts.items():  # several byte bars feed one count: the furthest along wins
                    entry[key] = max(entry[key], int(value))
                entry["at"] = time.time()

    def end(self, repo: str, state: str) -> None:
        with self._lock:
            if repo in self._repos:
                self._repos[repo].update(state=state, at=time.time())

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [dict(entry) for entry in self._repos.values()]


DOWNLOADS = Downloads()


def _progress_class(repo: str):
    """A tqdm that also logs the download's progress (every tenth of a bar) and feeds ``DOWNLOADS``, so a
    headless service shows it in its log and the console beside the services."""
    from huggingface_hub.utils import tqdm

    class LoggedProgress(tqdm):
        # A bar huggingface_hub disables (no terminal, progress bars off) neither counts nor keeps its unit, so
        # the counts are kept here; snapshot_download grows a bytes bar's ``total`` as each file's size is known.
        def __init__(self, *args, **kwargs):
            self.in_bytes = kwargs.get("unit") == "B"
            self.done = int(kwargs.get("initial") or 0)
            super().__init__(*args, **kwargs)
            self._logged = -1

        def update(self, n=1):
            out = super().update(n)
            self.done += int(n or 0)
            total = int(getattr(self, "total", 0) or 0)
            if self.in_bytes:
                DOWNLOADS.note(repo, bytes_done=self.done, bytes_total=total)
            else:  # the files bar of snapshot_download
                DOWNLOADS.note(repo, files_done=self.done, files_total=total)
            if total:
                tenth = int(10 * self.done / total)
                if tenth != self._logged:
                    self._logged = tenth
                    logger.info("hub.progress", extra={"repo": repo, "unit": "bytes" if self.in_bytes else "files",
                                                       "done": self.done, "total": total})  # fmt: skip
            return out

    return LoggedProgress


def _json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HubError(f"{path.name}: not readable JSON ({exc})") from None
    return value if isinstance(value, dict) else None
