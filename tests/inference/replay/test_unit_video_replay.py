"""An omni call on the unit engine (tiny MiniCPM-o) through facade/service/worker keeps the frames the engine
saw, one per unit; its replay on the same configuration runs the same units with the same frames."""

from __future__ import annotations

import asyncio
import io

import av
import numpy as np

from inference import api
from inference.contracts import Decision, Ready, SessionRequest
from tests.live_server import MINICPMO_DATA

UNITS = 5


def jpeg(level: int) -> bytes:
    frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), level, np.uint8), format="rgb24")
    out = io.BytesIO()
    with av.open(out, "w", format="image2pipe") as container:
        stream = container.add_stream("mjpeg", rate=1)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuvj420p"
        container.mux(stream.encode(frame.reformat(format="yuvj420p")))
        container.mux(stream.encode(None))
    return out.getvalue()


async def test_omni_call_keeps_its_frames_and_replays_with_them(tmp_path):
    from inference.models.minicpmo.fill import make_checkpoint

    checkpoint = make_checkpoint(tmp_path / "ckpt", data_dir=MINICPMO_DATA)
    await api.start(engine="minicpmo", checkpoint=checkpoint, slots=1, queue_max=0, record="on",
                    recordings_dir=tmp_path / "raw")  # fmt: skip
    try:
        handle = await api.open_session(SessionRequest(user_key="omni"))
        events = handle.events()
        assert isinstance(await asyncio.wait_for(anext(events), 120), Ready)
        pcm = (np.random.default_rng(1).standard_normal(16000) * 2000).astype("<i2").tobytes()

        async def feed():
            for unit in range(60):
                await handle.append_image(jpeg(40 + 3 * unit))
                await handle.append_audio(pcm, encoding="pcm16", rate=16000)
                await asyncio.sleep(1.0)

        feeder = asyncio.create_task(feed())
        decided = 0
        async with asyncio.timeout(240):
            async for event in events:
                decided += isinstance(event, Decision)
                if decided >= UNITS:
                    break
        feeder.cancel()
        session_id = handle.session_id
        await handle.close()
        for _ in range(100):
            if api.raw_recording_state(session_id) == "finished":
                break
            await asyncio.sleep(0.1)
        raw = api.read_recording(session_id)
        # the unit in flight at the close may end after the recording did
        assert raw.steps >= UNITS - 1 and len(raw.frames) >= UNITS - 2
        assert all(data[:2] == b"\xff\xd8" for _, data in raw.frames)
        frames = dict(raw.frames)
        replay = await asyncio.to_thread(api.replay_call, api.recording_steps_file(raw), frames, session_id="rp_omni")
        replayed = api.read_recording("rp_omni")
        assert replay.steps == raw.steps and dict(replayed.frames) == frames
        decisions = [e["kind"] for e in raw.events if e.get("k") == "decision"]
        assert [e["kind"] for e in replayed.events if e.get("k") == "decision"] == decisions
    finally:
        await api.shutdown()
