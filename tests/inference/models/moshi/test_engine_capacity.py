"""The lockstep engine reports what its page pool admits, and the service's status carries it to the console:
full windows the pool holds, the population ``PagePool.admissible`` holds at the planned call mix, and how many
more it takes now (at most the free slots)."""

from __future__ import annotations

import asyncio

import torch

from inference import api
from inference.contracts import Ready, SessionRequest
from inference.models.moshi.config import read_checkpoint_dir
from inference.models.moshi.fast.kv import SlotKV
from inference.models.moshi.fast.pages import mix_population
from tests.inference.models.moshi.moshi_lm_helpers import PERSONAPLEX_DATA

PAGE = 16


async def test_paged_engine_reports_its_capacity_through_the_service_status():
    lm = read_checkpoint_dir(PERSONAPLEX_DATA / "ckpt").lm
    page_bytes = SlotKV.bytes_per_slot(lm, torch.float32, fp8=False) * PAGE / lm.kv_window
    pages_per_slot = -(-lm.kv_window // PAGE)
    pool_pages = 3 * pages_per_slot + 5  # three full contexts and a bit, for 12 slots
    await api.start(engine="personaplex", checkpoint=PERSONAPLEX_DATA / "ckpt", slots=12, queue_max=2,
                    kv_page_frames=PAGE, kv_pool_gb=(pool_pages + 0.5) * page_bytes / 1e9,
                    kv_mean_call_s=10.0)  # fmt: skip
    try:
        idle = (await api.services())[0]
        assert idle.slots_used == 0 and idle.capacity["admits_now"] == 12
        capacity = idle.capacity
        assert capacity["slots"] == 12
        assert capacity["full_context"] == 3  # the pool's full windows, fewer than the slots
        expected = mix_population(pool_pages, PAGE, lm.kv_window, 125, 7500, limit=12)
        assert capacity["call_mix"] == expected and 3 < expected < 12  # more short calls than full contexts
        assert capacity["mean_call_s"] == 10.0
        first = await api.open_session(SessionRequest(user_key="ada"))
        assert isinstance(await asyncio.wait_for(anext(first.events()), 60), Ready)
        await first.append_audio(bytes(3840), encoding="pcm16", rate=24000)  # audio opens its engine slot
        held = (await api.services())[0]
        assert held.slots_used == 1  # one call held against the same capacity
        assert held.capacity["call_mix"] == expected  # the capacity is the pool's, not the moment's
        assert held.capacity["admits_now"] <= 11  # never more than the free slots
        await first.close()
    finally:
        await api.shutdown()


async def test_echo_service_capacity_is_its_slots():
    await api.start(engine="echo", slots=3)
    try:
        status = (await api.services())[0]
        assert status.capacity == {"slots": 3, "full_context": 3, "call_mix": 3, "mean_call_s": None,
                                   "admits_now": 3}  # fmt: skip
    finally:
        await api.shutdown()
