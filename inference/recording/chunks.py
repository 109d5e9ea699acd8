"""The raw recording format: one folder per session, append-only chunk files of checksummed records.

Layout of ``<recordings_dir>/<session_id>/``::

    meta.json            written once when the slot opens (who, which engine, rates, start time)
    chunk-000000.prc     records, appended; a new chunk every CHUNK_ROLL_S of call time
    chunk-000001.prc     ...
    end.json             written once when the session ends (reason, drops); absent = still running
                         or killed (the next service start writes it with reason "interrupted")

A record is an 11-byte header (magic ``PR``, kind, payload length, CRC-32 of the payload) and its
payload. Every record stands alone, so a file cut anywhere (a kill mid-write) loses only its last
record, and a damaged byte is found by the checksum instead of being played as noise.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

MAGIC = b"PR"
HEADER = struct.Struct("<2sBII")  # magic, kind, payload length, crc32(payload)
STEP = struct.Struct("<I")  # the slot's step index, leading every audio payload
TICK = struct.Struct("<Idf")  # step, seconds since the recording started, tick duration in ms
MAX_PAYLOAD = 16 * 1024 * 1024  # far above any tick's audio: a larger length is a damaged header
CHUNK_ROLL_S = 60.0
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))  # one encoder: json.dumps builds one a call (~2.5 us)

META_FILE = "meta.json"
END_FILE = "end.json"
CHUNK_GLOB = "chunk-*.prc"
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,100}")  # what the service generates; anything else never names a folder


class Kind:
    """Record kinds."""

    # STEP + pcm16 at the engine's input rate: what the engine received this step (format 2: absent when no
    # caller audio arrived for the step; the reader marks such runs as gaps)
    CALLER_AUDIO = 1
    AGENT_AUDIO = 2  # STEP + pcm16 at the engine's output rate: what the engine sent this step
    EVENT = 3  # JSON object with "k" (kind) and "t" (seconds since start): text, epoch, pause, ack ...
    TICK = 4  # TICK: one engine step of this session and how long the whole batch took
    FRAME = 5  # STEP + the camera frame (JPEG/PNG bytes) the engine saw this step (omni calls, unless turned off)
    TOKENS = 6  # STEP + int32 little-endian: the agent's tokens this step (lockstep: text then audio codebooks)


KINDS = (Kind.CALLER_AUDIO, Kind.AGENT_AUDIO, Kind.EVENT, Kind.TICK, Kind.FRAME, Kind.TOKENS)


def session_folder(root: Path, session_id: str) -> Path:
    if not SESSION_ID.fullmatch(session_id):
        raise ValueError(f"not a session id: {session_id!r}")
    return root / session_id


def folder_state(folder: Path) -> Literal["missing", "open", "finished"]:
    if (folder / END_FILE).exists():
        return "finished"
    return "open" if (folder / META_FILE).exists() else "missing"


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*") if p.is_file()) if folder.is_dir() else 0


def chunk_name(index: int) -> str:
    return f"chunk-{index:06d}.prc"


def encode_record(kind: int, payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, kind, len(payload), zlib.crc32(payload)) + payload


def encode_event(fields: dict[str, Any]) -> bytes:
    return encode_record(Kind.EVENT, _COMPACT_JSON.encode(fields).encode())


class ChunkError(Exception):
    """A chunk file that cannot be read to its end; ``chunk`` names the file, ``offset`` the bad byte."""

    def __init__(self, chunk: str, offset: int, problem: str, *, truncated: bool):
        super().__init__(f"{chunk}: {problem} at byte {offset}")
        self.chunk, self.offset, self.problem, self.truncated = chunk, offset, problem, truncated


@dataclass(frozen=True)
class Record:
    kind: int
    payload: bytes


def read_records(path: Path) -> Iterator[Record]:
    """Yield the records of one chunk file; raises ``ChunkError`` where it stops making sense."""
    with open(path, "rb") as f:
        yield from read_stream(f, path.name)


def read_stream(f: BinaryIO, name: str) -> Iterator[Record]:
    offset = 0
    while True:
        header = f.read(HEADER.size)
        if not header:
            return
        if len(header) < HEADER.size:
            raise ChunkError(name, offset, "truncated record header", truncated=True)
        magic, kind, length, crc = HEADER.unpack(header)
        if magic != MAGIC or kind not in KINDS:
            raise ChunkError(name, offset, "damaged record header", truncated=False)
        if length > MAX_PAYLOAD:
            raise ChunkError(name, offset, f"record length {length} out of range", truncated=False)
        payload = f.read(length)
        if len(payload) < length:
            raise ChunkError(name, offset, "truncated record", truncated=True)
        if zlib.crc32(payload) != crc:
            raise ChunkError(name, offset, "checksum mismatch", truncated=False)
        yield Record(kind, payload)
        offset += HEADER.size + length


def chunk_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(CHUNK_GLOB))


def read_json(path: Path) -> dict[str, Any] | None:
    """A small JSON file of the folder, or None when it is missing or unreadable."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Write whole or not at all: a kill mid-write must not leave half a meta/end file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    tmp.replace(path)
