"""The evaluation set's columns, twice: as an Arrow schema for the Parquet file, and as the ``datasets``
features stored in its metadata (so ``load_dataset`` types the audio columns as ``Audio``).

Kept side by side so a new column is added to both at once; ``datasets`` itself is not needed to write them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

METRIC_KEYS = (  # the turn-taking figures the review page shows, one column each
    "response_latency_mean_s",
    "overlap_s",
    "caller_cut_in",
    "agent_cut_in",
    "interruptions_yielded",
    "stop_latency_mean_s",
    "agent_backchannels",
    "caller_backchannels",
    "caller_talk_s",
    "agent_talk_s",
    "talk_ratio",
)


def _value(dtype: str) -> dict:
    return {"dtype": dtype, "_type": "Value"}


def _struct_of(fields: dict[str, str]) -> dict:
    return {name: _value(dtype) for name, dtype in fields.items()}


_AUDIO = {"_type": "Audio"}
_CONFIG = {"engine": "string", "checkpoint": "string", "persona_id": "int64", "persona": "string",
           "persona_version": "int64", "voice": "string"}  # fmt: skip
_LINE = {"start_s": "float64", "end_s": "float64", "speaker": "string", "text": "string"}
_SPAN = {"label": "string", "start_s": "float64", "end_s": "float64", "note": "string", "author": "string"}
_RATING = {"stars": "int64", "author": "string"}
_METRICS = {**{key: "float64" for key in METRIC_KEYS}, "echo_flagged": "bool", "echo_leak_db": "float64",
            "echo_delay_ms": "float64"}  # fmt: skip

FEATURES = {
    "session_id": _value("string"),
    "recording_id": _value("int64"),
    "user": _value("string"),
    "started_at": _value("string"),
    "duration_s": _value("float64"),
    "status": _value("string"),
    "mode": _value("string"),
    "caller_audio": _AUDIO,
    "agent_audio": _AUDIO,
    "sampling_rate": _value("int64"),
    "num_samples": _value("int64"),
    "config": _struct_of(_CONFIG),
    "transcript": {"feature": _struct_of(_LINE), "_type": "List"},
    "annotations": {"feature": _struct_of(_SPAN), "_type": "List"},
    "labels": {"feature": _value("string"), "_type": "List"},
    "ratings": {"feature": _struct_of(_RATING), "_type": "List"},
    "rating_mean": _value("float64"),
    "tags": {"feature": _value("string"), "_type": "List"},
    "metrics": _struct_of(_METRICS),
    "turn_taking_json": _value("string"),
    "echo_leak_json": _value("string"),
}


def _arrow(feature: dict) -> pa.DataType:
    import pyarrow as pa  # late: only an export needs it, and the web process imports this module's callers

    kind = feature.get("_type")
    if kind == "Value":
        return {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}[
            feature["dtype"]
        ]
    if kind == "Audio":
        return pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    if kind == "List":
        return pa.list_(_arrow(feature["feature"]))
    return pa.struct([(name, _arrow(sub)) for name, sub in feature.items()])


def arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([(name, _arrow(feature)) for name, feature in FEATURES.items()])
