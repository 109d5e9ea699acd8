"""Warm start: the in-process engine is loaded and one start prefilled in the background, before any call.

Real lockstep engine on a tiny random PersonaPlex checkpoint (made here), real service, real session; the
prefill cache's own hit count says whether the first session's start was prefilled or copied in.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inference.contracts import AudioOut, ParleyError, Ready, SessionRequest
from inference.embedded import ENGINE_UNAVAILABLE, EmbeddedService
from inference.models.moshi.make_checkpoint import make_checkpoint
from tests.inference.event_helpers import EventReader, send_frames

pytestmark = pytest.mark.usefixtures("single_torch_thread")  # tests/conftest.py

PERSONA = "You are a friendly, curious conversation partner. Keep your answers short."


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("tiny-personaplex", tmp_path_factory.mktemp("ckpt") / "ckpt", 0)


@pytest.fixture
def lockstep_env(monkeypatch, checkpoint, tmp_path):
    """The embedded service's environment: the tiny checkpoint in-process, one slot, nothing recorded."""
    for name, value in {
        "PARLEY_ENGINE": "personaplex",
        "PARLEY_CHECKPOINT": str(checkpoint),
        "PARLEY_SLOTS": "1",
        "PARLEY_RECORD": "off",
        "PARLEY_INFERENCE_URL": "",
        "PARLEY_REGISTRY_URL": "",
        "PARLEY_RECORDINGS_DIR": str(tmp_path / "raw"),
    }.items():
        monkeypatch.setenv(name, value)


async def first_session_start(embedded: EmbeddedService) -> tuple[int, int]:
    """Open the first session with PERSONA and speak until the agent's audio comes; the cache's (hits, misses)."""
    service = await embedded.local_service()
    handle = await service.open_session(SessionRequest(user_key="first", persona=PERSONA))
    reader = EventReader(handle)
    assert isinstance(await reader.next(within_s=10), Ready)
    sender = asyncio.create_task(send_frames(handle, range(1, 200)))
    try:
        await reader.until(AudioOut, within_s=60)
    finally:
        sender.cancel()
    cache = service.engine.prefill_cache
    await handle.close()
    return cache.hits, cache.misses


async def test_a_warm_start_prefills_the_default_start_so_the_first_session_starts_from_the_cache(lockstep_env):
    embedded = EmbeddedService()
    assert embedded.warm_start_status() == {"state": "off", "stage": ""}
    try:
        assert embedded.begin_warm_start(PERSONA) is True
        assert embedded.begin_warm_start(PERSONA) is False, "one warm start per process"
        # The first call waits for a warm-up still running, then starts its service on the warmed engine.
        service = await embedded.local_service()
        assert embedded.warm_start_status() == {"state": "ready", "stage": ""}
        assert service.warmed and len(service.engine.prefill_cache) == 1
        assert await first_session_start(embedded) == (1, 1), "the warm-up's prefill missed; the session's hit"
    finally:
        await embedded.stop()


async def test_without_a_warm_start_the_first_session_prefills_itself(lockstep_env):
    embedded = EmbeddedService()
    try:
        assert await first_session_start(embedded) == (0, 1)
        assert embedded.warm_start_status()["state"] == "off"
    finally:
        await embedded.stop()


async def test_a_warm_start_that_fails_says_so_and_the_first_call_gets_the_usual_error(
    lockstep_env, monkeypatch, tmp_path
):
    monkeypatch.setenv("PARLEY_CHECKPOINT", str(tmp_path / "no-such-checkpoint"))
    embedded = EmbeddedService()
    assert embedded.begin_warm_start(PERSONA) is True
    with pytest.raises(ParleyError) as info:
        await embedded.local_service()
    assert info.value.message == ENGINE_UNAVAILABLE and info.value.code == "engine_failed"
    assert embedded.warm_start_status()["state"] == "failed"


async def test_a_remote_service_is_not_warmed_from_the_web_process(lockstep_env, monkeypatch):
    monkeypatch.setenv("PARLEY_INFERENCE_URL", "unix:///nonexistent/parley.sock")
    embedded = EmbeddedService()
    assert embedded.begin_warm_start(PERSONA) is False
    assert embedded.warm_start_status() == {"state": "off", "stage": ""}
