"""Paged KV through the whole service: a caller waits in the queue for memory, not for a slot, and gets in
when a call ends (facade -> pool -> worker's published admission -> LockstepEngine on a small page pool)."""

from __future__ import annotations

import asyncio

import torch

from inference import api
from inference.contracts import Queued, Ready, SessionRequest
from inference.models.moshi.config import read_checkpoint_dir
from inference.models.moshi.fast.kv import SlotKV
from tests.inference.models.moshi.moshi_lm_helpers import PERSONAPLEX_DATA


async def next_event(handle, within_s: float = 60.0):
    return await asyncio.wait_for(anext(handle.events()), within_s)


async def test_a_caller_queues_for_kv_memory_while_slots_are_free_and_gets_in_when_a_call_ends():
    lm = read_checkpoint_dir(PERSONAPLEX_DATA / "ckpt").lm
    page_bytes = SlotKV.bytes_per_slot(lm, torch.float32, fp8=False) * 16 / lm.kv_window
    # 8 pages of 16 frames for 3 slots (a full context is 19 pages), calls planned at 10 s: two fresh calls
    # fit, but not one more beside a call that has started (its context grows and may reach 19 pages)
    await api.start(
        engine="personaplex",
        checkpoint=PERSONAPLEX_DATA / "ckpt",
        slots=3,
        queue_max=1,
        kv_page_frames=16,
        kv_pool_gb=8.5 * page_bytes / 1e9,
        kv_mean_call_s=10.0,
    )
    try:
        first = await api.open_session(SessionRequest(user_key="ada"))
        assert isinstance(await next_event(first), Ready)
        await first.append_audio(bytes(3840), encoding="pcm16", rate=24000)  # audio opens its engine slot
        await asyncio.sleep(0.5)  # a few ticks: the worker has counted the first call's memory
        second = await api.open_session(SessionRequest(user_key="bob"))
        waiting = await next_event(second)
        assert isinstance(waiting, Queued) and waiting.position == 1
        status = (await api.occupancy())[0]
        assert sum(s.state == "free" for s in status.slots) == 2  # slots were free: memory made it wait
        await first.close()
        assert isinstance(await next_event(second), Ready)
        await second.close()
    finally:
        await api.shutdown()
