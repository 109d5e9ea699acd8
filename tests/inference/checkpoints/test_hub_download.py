"""A hub id fetched over HTTP from a hub endpoint on loopback (``local_hub.LocalHub``, ``HF_ENDPOINT``): the
download's progress reaches the log (``hub.progress``) and ``inference.api.downloads()``, which the console
shows, while it runs and when it is done; a repository the hub does not have is a clear error."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from inference import api
from inference.checkpoints.hub import HubError, resolve_checkpoint
from inference.config import HubAccess
from tests.inference.checkpoints.local_hub import COMMIT, LocalHub

ROOT = Path(__file__).resolve().parents[3]
PERSONAPLEX = ROOT / "tests" / "data" / "personaplex" / "ckpt"
REPO = "nvidia/personaplex-7b-v1"


def entry(repo: str) -> dict | None:
    return next((d for d in api.downloads() if d["repo"] == repo), None)


def test_a_download_shows_its_progress_in_the_log_and_to_the_console(tmp_path, caplog):
    sizes = {p.name: p.stat().st_size for p in PERSONAPLEX.iterdir()}
    seen: list[dict] = []
    with LocalHub({REPO: PERSONAPLEX}, chunk_delay_s=0.05) as hub:
        access = HubAccess(cache_dir=tmp_path / "hub", endpoint=hub.url)
        result: dict = {}
        fetch = threading.Thread(target=lambda: result.update(folder=resolve_checkpoint(REPO, access)))
        with caplog.at_level(logging.INFO, logger="inference.checkpoints.hub"):
            fetch.start()
            while fetch.is_alive():  # what the console would read on its next push
                if (now := entry(REPO)) is not None:
                    seen.append(now)
                time.sleep(0.02)
            fetch.join()
    folder = result["folder"]
    assert folder.name == COMMIT and sorted(p.name for p in folder.iterdir()) == sorted(sizes)
    assert (folder / "model.safetensors").read_bytes() == (PERSONAPLEX / "model.safetensors").read_bytes()
    assert any(f"GET /{REPO}/resolve/{COMMIT}/model.safetensors" == r for r in hub.requests)
    # while it ran: a partial byte count against the whole
    partial = [d for d in seen if d["state"] == "downloading" and 0 < d["bytes_done"] < d["bytes_total"]]
    assert partial, seen[-5:]
    done = entry(REPO)
    fetched = sum(size for name, size in sizes.items() if name != "config.json")  # config.json came first
    assert done["state"] == "done" and done["bytes_done"] == done["bytes_total"] == fetched
    assert done["files_done"] == done["files_total"] == len(sizes)
    logged = [r for r in caplog.records if r.getMessage() == "hub.progress" and r.unit == "bytes"]
    assert logged and logged[-1].done == logged[-1].total == fetched
    assert 1 < len(logged) <= 11 + 2  # every tenth, not every chunk


def test_a_repository_the_hub_does_not_have_is_a_clear_error(tmp_path):
    with LocalHub({REPO: PERSONAPLEX}) as hub:
        access = HubAccess(cache_dir=tmp_path / "hub", endpoint=hub.url)
        with pytest.raises(HubError, match="kyutai/nothing-here"):
            resolve_checkpoint("kyutai/nothing-here", access)
    assert entry("kyutai/nothing-here")["state"] == "failed"
