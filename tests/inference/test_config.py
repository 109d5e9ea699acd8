"""Configuration from the environment, the engine registry, and the facade across event loops."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from inference import api
from inference.config import ConfigError, InferenceConfig
from inference.contracts import ParleyError, SessionRequest
from inference.engines import build_engine
from inference.engines.echo import EchoEngine
from inference.errors import EngineNotAvailable


def test_defaults_match_the_issue():
    config = InferenceConfig.from_env({})
    assert (config.engine, config.slots, config.queue_max) == ("echo", 4, 8)
    assert (config.disconnect_grace_s, config.pause_timeout_s, config.idle_timeout_s) == (30, 60, 300)
    assert (config.max_session_s, config.device, config.dtype, config.echo_delay_frames) == (3600, "cpu", "float32", 3)
    assert config.inference_url is None


def test_environment_is_parsed_and_typed():
    config = InferenceConfig.from_env(
        {
            "PARLEY_ENGINE": "moshi",
            "PARLEY_CHECKPOINT": "/models/moshi",
            "PARLEY_SLOTS": "2",
            "PARLEY_QUEUE_MAX": "0",
            "PARLEY_DISCONNECT_GRACE_S": "1.5",
            "PARLEY_INFERENCE_URL": "unix:///run/parley.sock",
            "PARLEY_INPUT_QUEUE_FRAMES": "8",
            "UNRELATED": "x",
        }
    )
    assert config.engine == "moshi" and config.checkpoint == Path("/models/moshi")
    assert (config.slots, config.queue_max, config.disconnect_grace_s) == (2, 0, 1.5)
    assert config.socket_path == "/run/parley.sock" and config.input_queue_frames == 8


@pytest.mark.parametrize(
    "env",
    [
        {"PARLEY_SLOTS": "many"},
        {"PARLEY_SLOTS": "0"},
        {"PARLEY_QUEUE_MAX": "-1"},
        {"PARLEY_PAUSE_TIMEOUT_S": "0"},
        {"PARLEY_INFERENCE_URL": "http://localhost:9000"},
        {"PARLEY_KV_PAGE_FRAMES": "100"},
        {"PARLEY_KV_POOL_GB": "-1"},
        {"PARLEY_KV_MEAN_CALL_S": "0"},
        {"PARLEY_UNIT_CONTEXT": "1024"},
        {"PARLEY_UNIT_CONTEXT": "long"},
    ],
)
def test_bad_values_are_config_errors(env):
    with pytest.raises(ConfigError):
        InferenceConfig.from_env(env)


def test_overrides_reject_unknown_fields():
    with pytest.raises(ConfigError, match="slotz"):
        InferenceConfig().with_overrides(slotz=2)


def test_registry_builds_echo_and_names_unknown_engines():
    engine = build_engine(InferenceConfig(slots=3, echo_delay_frames=5))
    assert isinstance(engine, EchoEngine) and engine.num_slots == 3 and engine.delay_frames == 5
    with pytest.raises(EngineNotAvailable, match="unknown engine 'gpt-9'"):
        build_engine(InferenceConfig(engine="gpt-9"))


def test_a_service_running_on_another_loop_is_used_there_not_restarted():
    """A sync view's async_to_sync runs on a fresh loop: it must not restart the live service."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(api.start(engine="echo", slots=1), loop).result(10)

        async def from_elsewhere():
            snapshots = await api.occupancy()
            with pytest.raises(ParleyError) as info:
                await api.open_session(SessionRequest(user_key="x"))
            assert info.value.code == "internal_error"
            return snapshots, await api.end_session("sess_missing")

        (snapshot,), ended = asyncio.run(from_elsewhere())
        assert snapshot.num_slots == 1 and ended is False
    finally:
        asyncio.run_coroutine_threadsafe(api.shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


@pytest.mark.parametrize(
    ("var", "value"),
    [("PARLEY_SLOTS", "four"), ("PARLEY_SLOTS", "0"), ("PARLEY_RECORD", "maybe"), ("PARLEY_KV_PAGE_FRAMES", "100")],
)
def test_a_bad_value_stops_the_service_naming_the_variable_and_value(var, value, tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, var: value, "PARLEY_INFERENCE_URL": f"unix://{tmp_path}/run/inference.sock"}
    result = subprocess.run(
        [sys.executable, "-m", "inference", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    # one line naming the variable and its value, not a traceback
    assert result.stderr.startswith("inference service: bad configuration: "), result.stderr[-2000:]
    assert f"{var}={value!r}" in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
