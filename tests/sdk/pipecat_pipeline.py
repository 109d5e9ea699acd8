"""Runs INSIDE .venv-pipecat (pipecat-ai, which pins other versions of protobuf, soundfile and soxr than ours).

A pipecat pipeline whose LLM is pipecat's stock ``OpenAIRealtimeLLMService`` with its base URL set to
Parley: a speech file goes in as ``InputAudioRawFrame`` frames at real-time pace, and what the service
yields downstream is recorded: its ``TTSAudioRawFrame`` audio (the agent's voice) as raw PCM16, and
every error. Nothing from Parley is imported here; ``tests/sdk/test_pipecat_realtime.py`` judges the result.

    python pipecat_pipeline.py WS_BASE_URL API_KEY MODEL SPEECH.wav OUT_PREFIX
"""

from __future__ import annotations

import asyncio
import json
import sys
import wave

from pipecat.frames.frames import EndFrame, ErrorFrame, Frame, InputAudioRawFrame, TTSAudioRawFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

CHUNK_MS = 20  # what a transport's microphone delivers
TAIL_S = 2.0  # keep listening after the file: the agent answers after it heard


class AgentAudio(FrameProcessor):
    """The pipeline's sink: the agent's audio and the errors, as they reach the end of the pipeline."""

    def __init__(self):
        super().__init__()
        self.pcm = bytearray()
        self.rates: set[int] = set()
        self.errors: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.pcm.extend(frame.audio)
            self.rates.add(frame.sample_rate)
        elif isinstance(frame, ErrorFrame):
            self.errors.append(str(frame.error))
        await self.push_frame(frame, direction)


async def run_pipeline(base_url: str, api_key: str, model: str, rate: int, pcm: bytes) -> AgentAudio:
    llm = OpenAIRealtimeLLMService(
        api_key=api_key,
        base_url=f"{base_url}/realtime",
        settings=OpenAIRealtimeLLMService.Settings(model=model, system_instruction="You are a helpful guide."),
    )
    sink = AgentAudio()
    worker = PipelineWorker(
        Pipeline([llm, sink]),
        params=PipelineParams(audio_in_sample_rate=rate, audio_out_sample_rate=24000),
        idle_timeout_secs=None,
    )

    @worker.event_handler("on_pipeline_error")
    async def on_error(_worker, frame):
        sink.errors.append(str(frame.error))

    async def speak() -> None:
        await asyncio.sleep(1.0)  # session.created, then pipecat's session.update
        chunk = rate * CHUNK_MS // 1000 * 2
        loop = asyncio.get_running_loop()
        start = loop.time()
        for n, offset in enumerate(range(0, len(pcm), chunk)):
            frame = InputAudioRawFrame(audio=pcm[offset : offset + chunk], sample_rate=rate, num_channels=1)
            await worker.queue_frame(frame)
            await asyncio.sleep(max(0.0, start + (n + 1) * CHUNK_MS / 1000 - loop.time()))
        await asyncio.sleep(TAIL_S)
        await worker.queue_frame(EndFrame())

    speaking = asyncio.create_task(speak())
    await WorkerRunner(handle_sigint=False).run(worker)
    await speaking
    return sink


def main(base_url: str, api_key: str, model: str, speech: str, out: str) -> None:
    with wave.open(speech) as wav:
        rate, pcm = wav.getframerate(), wav.readframes(wav.getnframes())
    sink = asyncio.run(run_pipeline(base_url, api_key, model, rate, pcm))
    with open(out + ".pcm", "wb") as handle:
        handle.write(bytes(sink.pcm))
    with open(out + ".json", "w") as handle:
        json.dump({"rates": sorted(sink.rates), "errors": sink.errors, "bytes": len(sink.pcm)}, handle)


if __name__ == "__main__":
    main(*sys.argv[1:6])
