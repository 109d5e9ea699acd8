"""Production logs are JSON lines whose keys include the ``extra={...}`` fields of the call that logged."""

from __future__ import annotations

import io
import json
import logging
import logging.config

import pytest

from webapp.common.logs import logging_config
from webapp.recordings import tasks
from webapp.recordings.models import Recording


@pytest.mark.django_db
def test_a_production_log_line_carries_session_id_and_reason_as_json_fields(make_recording):
    config = logging_config(json_lines=True)
    stream = io.StringIO()
    config["handlers"]["console"]["stream"] = stream
    logging.config.dictConfig(config)
    try:
        recording = make_recording(session_id="sess_json_log")
        tasks._finish(recording, Recording.Status.FAILED, "no audio arrived")
    finally:
        logging.config.dictConfig(logging_config(json_lines=False))
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    line = next(x for x in lines if x["message"] == "recordings.processed")
    assert line["session_id"] == "sess_json_log" and line["reason"] == "no audio arrived"
    assert line["levelname"] == "WARNING" and line["name"] == "webapp.recordings.tasks"
