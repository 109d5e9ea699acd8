"""The caller's side of a recording's transcript: timed words from the caller's track, in lines.

Post-processing (``tasks.process_recording``) transcribes the caller's track through
``inference.api.transcribe_speech`` (the engine ``PARLEY_TRANSCRIBER`` / ``PARLEY_WHISPER_WEIGHTS`` pick)
and merges the caller's lines into ``transcript.json`` beside the agent's: each caller line carries
``"speaker": "caller"`` and its words with their times, so the review page labels and seeks both sides
and the catalogue's search text holds what either side said.
"""

from __future__ import annotations

import json
from typing import Any

from webapp.recordings.render import LINE_GAP_S, LINE_MAX_CHARS, Rendered

CALLER = "caller"


def caller_lines(words: list[Any]) -> list[dict[str, Any]]:
    """Timed words (``.text``, ``.start``, ``.end``) joined into lines at silences over ``LINE_GAP_S``."""
    lines: list[dict[str, Any]] = []
    for word in words:
        current = lines[-1] if lines else None
        if current is None or word.start - current["end"] > LINE_GAP_S or len(current["text"]) >= LINE_MAX_CHARS:
            current = {"start": round(word.start, 3), "end": round(word.end, 3), "text": "", "speaker": CALLER,
                       "words": []}  # fmt: skip
            lines.append(current)
        current["text"] = f"{current['text']} {word.text}".strip()
        current["end"] = round(word.end, 3)
        current["words"].append([word.text, round(word.start, 3), round(word.end, 3)])
    return lines


def with_caller_lines(rendered: Rendered, words: list[Any]) -> Rendered:
    """``rendered`` with the caller's lines merged into its transcript (time order) and search text."""
    name, content = rendered.files["transcript"]
    agent = json.loads(content)["lines"]
    caller = caller_lines(words)
    merged = sorted(agent + caller, key=lambda line: line["start"])
    files = {**rendered.files, "transcript": (name, json.dumps({"lines": merged}, separators=(",", ":")).encode())}
    said = "\n".join(line["text"] for line in caller)
    text = f"{rendered.transcript_text}\n{said}".strip() if said else rendered.transcript_text
    return Rendered(files, rendered.duration_s, text)
