"""An evaluation set from a selection of recordings: a folder ``datasets.load_dataset`` reads.

Layout (``README.md`` names the Parquet file as the data, so the WAVs beside it are not mistaken for
an audio folder)::

    README.md                       dataset card: what each column means, and the data_files
    data/train-00000-of-00001.parquet   one row per call; audio embedded (bytes + path), Audio features
    manifest.jsonl                  one JSON line per call: the same row, audio as relative file paths
    calls/<session_id>/caller.wav   the caller's track (what the agent heard), at the stored rate
    calls/<session_id>/agent.wav    the agent's track, at the same rate and length
    calls/<session_id>/transcript.json

Both tracks come from the recording's stored stereo WAV (caller left, agent right), so they have its
rate and its length. Pure but for the storage reads: rows come in, files go out; the caller checks
who may see what (``export_tasks``).
"""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from webapp.recordings.annotations import export_review
from webapp.recordings.export_schema import FEATURES, METRIC_KEYS, arrow_schema
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

PARQUET_NAME = "data/train-00000-of-00001.parquet"
MANIFEST_NAME = "manifest.jsonl"


class ExportError(Exception):
    """A recording that cannot go into the set (no stored audio); the message names it."""


def exportable(rows: Iterable[Recording]) -> list[Recording]:
    """The rows of a selection that have stored audio (failed and unfinished calls have none)."""
    return [r for r in rows if r.playable and "wav" in r.files]


def build(recordings: list[Recording], out: Path, progress: Callable[[float], None] = lambda _: None) -> int:
    """Write the set for ``recordings`` into the empty or missing folder ``out``; returns the number of calls."""
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out.name}: the folder is not empty")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, recording in enumerate(recordings):
        rows.append(_write_call(recording, out))
        progress((i + 1) / (len(recordings) + 1))
    with (out / MANIFEST_NAME).open("w") as manifest:
        for row in rows:
            manifest.write(json.dumps(row) + "\n")  # audio columns hold the WAVs' relative paths
    _write_parquet(rows, out)
    (out / "README.md").write_text(CARD)
    progress(1.0)
    return len(rows)


def archive(folder: Path, target: io.BufferedIOBase | Path) -> None:
    """``folder`` as a zip whose top level is the set (unzip it and load the folder)."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zipped:  # WAVs and Parquet barely deflate
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zipped.write(path, path.relative_to(folder).as_posix())


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _write_call(recording: Recording, out: Path) -> dict[str, Any]:
    storage = recordings_storage()
    try:
        with storage.open(recording.files["wav"], "rb") as f:
            stereo, rate = sf.read(io.BytesIO(f.read()), dtype="int16", always_2d=True)
        transcript = _stored_json(recording, "transcript").get("lines", [])
    except (KeyError, FileNotFoundError, OSError, RuntimeError, ValueError) as exc:
        raise ExportError(f"{recording.session_id}: its stored files cannot be read ({type(exc).__name__})") from exc
    if stereo.shape[1] != 2:
        raise ExportError(f"{recording.session_id}: the stored audio has {stereo.shape[1]} channels, not 2")
    folder = out / "calls" / recording.session_id
    folder.mkdir(parents=True)
    audio = {}
    for channel, side in enumerate(("caller", "agent")):
        name = f"calls/{recording.session_id}/{side}.wav"
        sf.write(out / name, np.ascontiguousarray(stereo[:, channel]), rate, subtype="PCM_16")
        audio[side] = name
    (folder / "transcript.json").write_text(json.dumps({"lines": transcript}))
    turn_taking, echo = recording.turn_taking or {}, recording.echo_leak or {}
    return {
        "session_id": recording.session_id,
        "recording_id": recording.pk,
        "user": recording.user.username,
        "started_at": recording.started_at.isoformat(),
        "duration_s": recording.duration_s,
        "status": recording.status,
        "mode": recording.mode,
        "caller_audio": audio["caller"],
        "agent_audio": audio["agent"],
        "sampling_rate": int(rate),
        "num_samples": int(len(stereo)),
        "config": {
            "engine": recording.engine,
            "checkpoint": recording.checkpoint_name,
            "persona_id": recording.persona_id,
            "persona": recording.persona_name,
            "persona_version": recording.persona_version,
            "voice": recording.voice,
        },
        "transcript": [_line(line) for line in transcript],
        **export_review(recording),
        "metrics": {
            **{key: _number(turn_taking.get(key)) for key in METRIC_KEYS},
            "echo_flagged": bool(echo.get("flagged")) if "flagged" in echo else None,
            "echo_leak_db": _number(echo.get("leak_db")),
            "echo_delay_ms": _number(echo.get("delay_ms")),
        },
        # Everything the measures found (segments, each overlap and interruption), as the pages read it.
        "turn_taking_json": json.dumps(turn_taking),
        "echo_leak_json": json.dumps(echo),
    }


def _stored_json(recording: Recording, kind: str) -> dict:
    with recordings_storage().open(recording.files[kind], "rb") as f:
        return json.loads(f.read())


def _line(line: dict) -> dict:
    return {
        "start_s": float(line.get("start", 0.0)),
        "end_s": float(line.get("end", line.get("start", 0.0))),
        "speaker": str(line.get("speaker", "agent")),
        "text": str(line.get("text", "")),
    }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _write_parquet(rows: list[dict], out: Path) -> None:
    # pyarrow is needed only here: imported late so the web process does not load it for every page.
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {name: [] for name in arrow_schema().names}
    for row in rows:
        for name in columns:
            value = row[name]
            if name in ("caller_audio", "agent_audio"):  # embedded, so the Parquet file stands on its own
                value = {"bytes": (out / value).read_bytes(), "path": value}
            columns[name].append(value)
    table = pa.table(columns, schema=arrow_schema())
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": FEATURES}})})
    (out / "data").mkdir(exist_ok=True)
    pq.write_table(table, out / PARQUET_NAME)


CARD = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/*.parquet
---
# Parley evaluation set

Recorded calls with their reviews, one row per call, exported from Parley's recordings list.

```python
import datasets
calls = datasets.load_dataset("path/to/this/folder", split="train")
```

- `caller_audio`, `agent_audio`: the two tracks (mono WAV, 16-bit) at `sampling_rate`, `num_samples` long
  each, on the call's wall clock (silence where the call had no audio). Also under `calls/<session_id>/`.
- `transcript`: lines with `start_s`, `end_s`, `speaker` and `text`.
- `annotations`: labelled spans (`label`, `start_s`, `end_s`, `note`, `author`); `labels`: their distinct names.
- `ratings` (1-5, one per reviewer), `rating_mean`, `tags`.
- `metrics`: turn-taking and echo figures; `turn_taking_json` / `echo_leak_json`: the full measures.
- `config`: what produced the call (engine, checkpoint, persona and its version, voice).

`manifest.jsonl` holds the same rows with the audio as paths relative to this folder.
"""
