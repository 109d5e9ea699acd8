"""A whole session through the inference facade on the lockstep engine with the tiny PersonaPlex pack.

The same path the browser call takes below the web tier: facade -> service -> worker tick -> LockstepEngine.
"""

from __future__ import annotations

import asyncio

import numpy as np

from inference import api
from inference.contracts import AudioOut, Prefill, Ready, SessionRequest, TextOut, VoiceRef
from tests.inference.models.moshi.moshi_lm_helpers import PERSONAPLEX_DATA


async def test_personaplex_session_prefills_then_talks():
    await api.start(engine="personaplex", checkpoint=PERSONAPLEX_DATA / "ckpt", slots=2, queue_max=0)
    try:
        handle = await api.open_session(
            SessionRequest(
                user_key="alice",
                persona=(PERSONAPLEX_DATA / "persona.txt").read_text(),
                voice=VoiceRef("pack", PERSONAPLEX_DATA / "voice_prompt.pt"),
            )
        )
        events = handle.events()
        ready = await asyncio.wait_for(anext(events), 60)
        assert isinstance(ready, Ready)
        caps = ready.capabilities
        assert (caps.engine, caps.family, caps.input_chunk_samples, caps.output_rate) == (
            "personaplex", "lockstep", 1920, 24000,
        )  # fmt: skip
        rng = np.random.default_rng(0)
        pcm = (rng.standard_normal(1920 * 40) * 3000).astype("<i2").tobytes()
        seen: list = []

        async def feed():
            for i in range(40):
                await handle.append_audio(pcm[i * 3840 : (i + 1) * 3840], encoding="pcm16", rate=24000)
                await asyncio.sleep(0.08)

        feeder = asyncio.create_task(feed())
        try:
            async with asyncio.timeout(60):
                async for event in events:
                    seen.append(event)
                    if sum(isinstance(e, AudioOut) for e in seen) >= 20:
                        break
        finally:
            feeder.cancel()
        prefill = [e for e in seen if isinstance(e, Prefill)]
        assert prefill and prefill[-1].done and prefill[-1].progress == 1.0
        audio = [e for e in seen if isinstance(e, AudioOut)]
        assert all(len(a.pcm16) == 3840 for a in audio)
        assert any(np.frombuffer(a.pcm16, "<i2").any() for a in audio)  # the random model makes sound
        texts = [e.text for e in seen if isinstance(e, TextOut)]
        assert all(isinstance(t, str) and t for t in texts)
        await handle.close()
    finally:
        await api.shutdown()
