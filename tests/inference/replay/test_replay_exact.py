"""A call recorded through the real path (facade -> service -> worker tick -> lockstep engine -> recorder),
replayed from its steps file: on the same configuration with greedy decoding the agent's tokens come back
exactly, step for step; with another persona they do not, and the replay is a recording of its own."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from inference import api
from inference.contracts import AudioOut, ParleyError, Ready, SessionRequest, VoiceRef
from tests.inference.models.moshi.moshi_lm_helpers import PERSONAPLEX_DATA

FRAMES = 30
VOICE = VoiceRef("pack", PERSONAPLEX_DATA / "voice_prompt.pt")


async def _recorded_call(persona: str) -> str:
    handle = await api.open_session(SessionRequest(user_key="replayer", persona=persona, voice=VOICE))
    events = handle.events()
    ready = await asyncio.wait_for(anext(events), 60)
    assert isinstance(ready, Ready)
    pcm = (np.random.default_rng(0).standard_normal(1920 * FRAMES) * 3000).astype("<i2").tobytes()

    async def feed():
        for i in range(FRAMES):
            await handle.append_audio(pcm[i * 3840 : (i + 1) * 3840], encoding="pcm16", rate=24000)
            await asyncio.sleep(0.08)

    feeder = asyncio.create_task(feed())
    heard = 0
    async with asyncio.timeout(120):
        async for event in events:
            heard += isinstance(event, AudioOut)
            if heard >= FRAMES:
                break
    await feeder
    session_id = handle.session_id
    await handle.close()
    for _ in range(100):
        if api.raw_recording_state(session_id) == "finished":
            break
        await asyncio.sleep(0.1)
    return session_id


async def test_greedy_replay_gives_the_calls_agent_tokens(tmp_path):
    persona = (PERSONAPLEX_DATA / "persona.txt").read_text()
    await api.start(engine="personaplex", checkpoint=PERSONAPLEX_DATA / "ckpt", slots=2, queue_max=0, greedy=True,
                    record="on", recordings_dir=tmp_path)  # fmt: skip
    try:
        source_id = await _recorded_call(persona)
        raw = api.read_recording(source_id)
        assert raw.meta["greedy"] is True and raw.steps >= FRAMES // 2
        steps_file = api.recording_steps_file(raw)
        original = api.recording_agent_tokens(steps_file)
        assert len(original) == raw.steps and all(len(t) == 17 for t in original.values())  # text + 16 codebooks

        same = await asyncio.to_thread(api.replay_call, steps_file, {}, session_id="rp_same", voice=VOICE)
        assert same.steps == raw.steps
        replayed = api.read_recording("rp_same")
        assert replayed.meta["replay_of"] == source_id
        assert replayed.agent_tokens == original  # every step, every token

        other = await asyncio.to_thread(
            api.replay_call, steps_file, {}, session_id="rp_other", voice=VOICE, persona="You are a pirate.",
            pace="original",
        )  # fmt: skip
        changed = api.read_recording("rp_other")
        assert other.seconds >= (raw.step_time(raw.steps - 1) - raw.step_time(0)) * 0.95  # the caller's pace kept
        assert changed.meta["persona"] == "You are a pirate." and len(changed.agent_tokens) == raw.steps
        assert changed.agent_tokens != original
    finally:
        await api.shutdown()


def test_a_damaged_steps_file_is_a_typed_error():
    with pytest.raises(ParleyError) as caught:
        api.replay_call(b"PR\x03garbage", {}, session_id="rp_bad")
    assert caught.value.code == "recording_unreadable"
