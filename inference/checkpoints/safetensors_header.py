"""A safetensors file's tensor table read from its header alone: no tensor data is read or mapped.

The format is an 8-byte little-endian header length, that many bytes of JSON (``{name: {dtype, shape,
data_offsets}}`` plus an optional ``__metadata__``), then the data. A header that is cut short, not JSON, or
whose offsets run past the end of the file (a partial download) raises ``HeaderError`` naming the file.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

# bytes per element of each safetensors dtype name
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit


class HeaderError(ValueError):
    """A safetensors file whose header cannot be read; the message names the file and the fault."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as its header describes it."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: str | Path) -> dict[str, TensorEntry]:
    """Every tensor of ``path`` by name, from the header only.

    Raises:
        HeaderError: missing file, header length or JSON cut short or malformed, an unknown dtype, offsets
            that disagree with the shape, or data past the end of the file.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise HeaderError(f"{path}: {size} bytes, too short for a safetensors header (truncated?)")
            (length,) = struct.unpack("<Q", head)
            if length > _MAX_HEADER or 8 + length > size:
                raise HeaderError(
                    f"{path}: header says {length} bytes of JSON but the file has {size - 8} after the length "
                    "(truncated or not a safetensors file)"
                )
            raw = f.read(length)
    except FileNotFoundError:
        raise HeaderError(f"{path}: file does not exist") from None
    except OSError as exc:
        raise HeaderError(f"{path}: not readable ({exc})") from exc
    try:
        table = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"{path}: header is not JSON ({exc}; truncated or not a safetensors file)") from exc
    if not isinstance(table, dict):
        raise HeaderError(f"{path}: header is not a JSON object")
    data_bytes = size - 8 - length
    out: dict[str, TensorEntry] = {}
    for name, entry in table.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise HeaderError(f"{path}: tensor {name!r} has a malformed header entry ({exc!r})") from None
        if dtype not in DTYPE_BYTES:
            raise HeaderError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
        tensor = TensorEntry(dtype, shape)
        if end - begin != tensor.numel * DTYPE_BYTES[dtype]:
            raise HeaderError(f"{path}: tensor {name!r} spans {end - begin} bytes, its shape {shape} needs "
                              f"{tensor.numel * DTYPE_BYTES[dtype]}")  # fmt: skip
        if end > data_bytes:
            raise HeaderError(
                f"{path}: tensor {name!r} ends at byte {end} of the data but the file holds {data_bytes} "
                "(truncated: a partial download?)"
            )
        out[name] = tensor
    return out
