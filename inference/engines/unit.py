"""The unit engine: MiniCPM-o 4.5 full duplex behind the engine contract.

Every tick (1 s) each live slot gets one unit of 16 kHz audio (and, in omni calls, one camera frame); the
engine prefills it, decides listen or speak, and returns the text and 24 kHz audio of the unit. Slots are
sessions of one loaded model served in turn within the tick: each has its own LLM, audio and TTS caches
(``DuplexSession``). The finalize of a unit is deferred to the slot's next prefill, so the result leaves
first. A slot absent from a tick's inputs (paused, frozen) keeps its state untouched.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from inference.audio.resample import resample_clip
from inference.contracts import VoiceRef
from inference.engines.base import (
    ChatRequest,
    Engine,
    EngineCapabilities,
    EngineError,
    ProgressFn,
    SlotConfig,
    SlotInput,
    SlotOutput,
)
from inference.models.minicpmo.audio_encoder import UNIT_SAMPLES
from inference.models.minicpmo.chat import ChatReply
from inference.models.minicpmo.config import CheckpointError, MiniCPMOConfig
from inference.models.minicpmo.duplex import DuplexRunner, DuplexSession, UnitResult, window_bounds
from inference.models.minicpmo.fast.runner import DEFAULT_CAPACITY, FastDuplexRunner
from inference.models.minicpmo.loading import MiniCPMOParts, load_model
from inference.models.minicpmo.vision import FrameError, decode_frame
from inference.models.minicpmo.vocoder import (
    OUTPUT_RATE,
    SilentVocoder,
    Token2WavVocoder,
    VocoderState,
    build_vocoder,
    vocoder_kind,
)

logger = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = "Streaming Omni Conversation."
DEMO_WEIGHTS_MAX_BYTES = 1 << 30  # the real model is ~18 GB; tiny random checkpoints ~200 MB
# Worst-case LLM positions one unit takes: <unit> + 10 audio + 19 decided ids + terminator/</unit>.
AUDIO_UNIT_MAX_POSITIONS = 32
# Room kept for a vocoder batch, in sessions' worth of vocoder memory at their longest: a batch holds its streams'
# caches three times over while it runs, and a bigger one that does not fit runs again in halves.
VOCODER_BATCH_HEADROOM = 24
FRAME_POSITIONS = 66  # <image> + 64 + </image>
# New sessions prepared in one tick stop once their prepares took this share of the unit (one always runs): the
# others wait a tick, so a crowd of callers arriving at once delays their own start, not every live call's unit.
PREPARE_SHARE = 0.2
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_reference_audio(path: Path) -> np.ndarray:
    """A voice reference (.npy float at 16 kHz, or any soundfile-readable file) as float32 16 kHz mono."""
    if path.suffix == ".npy":
        audio = np.load(path, allow_pickle=False)
        rate = 16000
    else:
        import soundfile

        audio, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        audio = audio.mean(axis=1)
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1 or audio.shape[0] < 400:
        raise EngineError(f"voice reference {path.name}: expected mono audio of at least 25 ms")
    return resample_clip(audio, rate, 16000)


@dataclass
class _UnitSlot:
    """One slot: its config, its model session and its vocoder state."""

    config: SlotConfig
    session: DuplexSession | None = None  # None until the prepare tick ran
    vocoder: VocoderState = field(default_factory=VocoderState)
    end_turn_requested: bool = False  # barge-in: the next unit closes the speaking turn


class UnitEngine(Engine):
    """MiniCPM-o 4.5 duplex served as the unit engine.

    Args:
        checkpoint: checkpoint directory in the published layout.
        num_slots: sessions served by the one model instance.
        device: torch device string.
        dtype: ``float32`` (CPU, goldens), ``bfloat16`` or ``float16``.
        fast: serve through the static-cache, batched, CUDA-graphed runner (``fast/``); default: on CUDA.
        context: LLM positions per session, capped by the checkpoint's own limit: the sliding window keeps each
            call inside them, on both runners (``PARLEY_UNIT_CONTEXT``).
    """

    def __init__(
        self,
        checkpoint: Path,
        num_slots: int = 1,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        fast: bool | None = None,
        context: int = DEFAULT_CAPACITY,
    ):
        if num_slots < 1:
            raise EngineError("num_slots must be >= 1")
        if dtype not in _DTYPES:
            raise EngineError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        self.checkpoint = Path(checkpoint)
        self.num_slots = num_slots
        self.device = device
        self.dtype = _DTYPES[dtype]
        self.fast = device.startswith("cuda") if fast is None else fast
        self.context = context  # capped by the checkpoint's limit once its config is read (_static_capabilities)
        self.parts: MiniCPMOParts | None = None
        self.runner: DuplexRunner | None = None
        self.vocoder = SilentVocoder()
        self._slots: dict[int, _UnitSlot] = {}
        # A new session's vocoder at its longest (the built-in voice), measured at warm-up with Token2Wav on a GPU;
        # None: device memory does not limit admission (admissible_sessions).
        self._vocoder_session_bytes: int | None = None
        self.prepare_share = PREPARE_SHARE
        self.capabilities = self._static_capabilities()

    @classmethod
    def from_config(cls, config) -> UnitEngine:  # config: inference.config.InferenceConfig
        """Build from the service configuration (checkpoint, slots, device, dtype, unit context)."""
        if config.checkpoint is None:
            raise EngineError("the minicpmo engine needs PARLEY_CHECKPOINT (a MiniCPM-o 4.5 checkpoint directory)")
        return cls(
            Path(config.checkpoint), config.slots, device=config.device, dtype=config.dtype, context=config.unit_context
        )

    def _static_capabilities(self) -> EngineCapabilities:
        """Capabilities known before loading (the service may announce them before warmup ends)."""
        try:
            cfg = MiniCPMOConfig.from_dir(self.checkpoint)
        except CheckpointError as exc:
            raise EngineError(f"cannot use {self.checkpoint}: {exc}") from exc
        self.context = min(self.context, cfg.max_position_embeddings)
        _, usable = window_bounds(self.context)
        weight_bytes = sum(f.stat().st_size for f in self.checkpoint.glob("*.safetensors"))
        return self._capabilities(
            vocoder=vocoder_kind(self.checkpoint, self.device),
            demo=weight_bytes < DEMO_WEIGHTS_MAX_BYTES,
            memory_s=float(usable // AUDIO_UNIT_MAX_POSITIONS),
            memory_s_omni=float(usable // (AUDIO_UNIT_MAX_POSITIONS + FRAME_POSITIONS)),
        )

    def _capabilities(self, *, vocoder: str, demo: bool, memory_s: float, memory_s_omni: float) -> EngineCapabilities:
        return EngineCapabilities(
            engine="minicpmo",
            family="unit",
            chunk_period_ms=1000,
            input_rate=16000,
            input_chunk_samples=UNIT_SAMPLES,
            output_rate=OUTPUT_RATE,
            video=True,
            demo_weights=demo,
            modes=("duplex", "half_duplex", "chat"),
            extra={
                "vocoder": vocoder,
                "memory_s": memory_s,  # the sliding window keeps at least this much audio-only call
                "memory_s_omni": memory_s_omni,  # ... and this much of an omni call (one frame per unit)
                "demo_weights": demo,
            },
        )

    # -- lifecycle -------------------------------------------------------------------------------------------

    def warmup(self, progress: ProgressFn | None = None, *, loaded: MiniCPMOParts | None = None) -> None:
        """Load the checkpoint, pick the vocoder, and run one throw-away session through prepare and a unit.

        Args:
            progress: called with (fraction, stage) as loading goes on.
            loaded: the model already in memory instead of the checkpoint's weights (its directory still gives
                the config and the vocoder's assets): the serving bench builds random weights at the real 4.5
                shapes on the GPU through this very path without writing 18 GB to disk first.
        """
        report = progress or (lambda fraction, stage: None)
        report(0.0, "loading MiniCPM-o checkpoint")
        try:
            parts = loaded if loaded is not None else load_model(self.checkpoint, device=self.device, dtype=self.dtype)
            self.parts = parts
        except CheckpointError as exc:
            raise EngineError(f"cannot load {self.checkpoint}: {exc}") from exc
        if self.fast:
            # +1: the warm-up session
            runner = FastDuplexRunner(self.parts, num_slots=self.num_slots + 1, capacity=self.context)
            # the invariant kernels' first launches build them (Triton), then every bucket is captured (~17 s on an H200)
            report(0.4, "building kernels, capturing CUDA graphs")
            runner.capture()
            self.runner = runner
        else:
            window_max, window_target = window_bounds(self.context)
            self.runner = DuplexRunner(self.parts, window_max=window_max, window_target=window_target)
        try:
            self.vocoder = build_vocoder(self.checkpoint, self.device)
        except CheckpointError as exc:  # bad Token2Wav assets: refuse to start rather than speak silence
            raise EngineError(f"cannot load the vocoder: {exc}") from exc
        if isinstance(self.vocoder, Token2WavVocoder) and self.device.startswith("cuda"):
            self.watch_vocoder_memory()
        if self.vocoder.name != self.capabilities.extra["vocoder"]:  # e.g. the package failed to load
            self.capabilities = dataclasses.replace(
                self.capabilities, extra={**self.capabilities.extra, "vocoder": self.vocoder.name}
            )
        if self.capabilities.demo_weights or self.device.startswith("cuda"):
            # Process-wide, like every torch thread knob. A tiny model on CPU is bound by per-op overhead: extra
            # intra-op threads only add contention (4x slower units on a shared 2-core host). On CUDA the host's
            # torch work is small (the unit's mel): beside the launching thread, 16 intra-op threads made it spike
            # to 30-77 ms in about one unit in eight, the listen unit's p99
            # (bench/results/unit-host-threads-h200-897b290.json).
            torch.set_num_threads(1)
        report(0.7, "warming up the unit loop")
        session = self.runner.new_session()
        self.runner.prepare(session, DEFAULT_SYSTEM_PROMPT, np.zeros(UNIT_SAMPLES, np.float32))
        frame = self.parts.vision.embed_frame(np.zeros((self.parts.config.image_size,) * 2 + (3,), np.uint8))
        self.runner.prefill(session, np.zeros(UNIT_SAMPLES, np.float32), frame)
        self.runner.generate(session, force_listen=True)
        self.runner.finalize(session)
        del session
        report(1.0, "MiniCPM-o ready")

    def open_slot(self, slot: int, config: SlotConfig) -> None:
        """Reserve ``slot``; the prepare (system prompt + voice) runs on the next step."""
        self._check_slot(slot)
        if self.runner is None:
            raise EngineError("warmup() must run before open_slot()")
        if slot in self._slots:
            raise EngineError(f"slot {slot} is already open")
        self._slots[slot] = _UnitSlot(config=config)

    def close_slot(self, slot: int) -> None:
        """Drop every cache the slot's session took and hand device memory back."""
        self._check_slot(slot)
        if self._slots.pop(slot, None) is None:
            return
        # The session's caches hold no reference cycles, so dropping the slot frees them at once
        # (tests check this with weak references); only the CUDA allocator's cache is left to return.
        if self.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def cancel(self, slot: int) -> None:
        """Barge-in: the slot's next unit is a forced listen, which closes a speaking turn."""
        state = self._slots.get(slot)
        if state is not None:
            state.end_turn_requested = True

    def chat(self, slot: int, request: ChatRequest) -> Iterator[SlotOutput]:
        """Chat mode: the reply to ``request`` (``inference.models.minicpmo.chat``), piece by piece."""
        self._check_slot(slot)
        if self.runner is None:
            raise EngineError("warmup() must run before chat()")
        if slot in self._slots:
            raise EngineError(f"slot {slot} is open for a call")
        ref_audio = _voice_audio(slot, request.voice)
        prompt = request.persona or DEFAULT_SYSTEM_PROMPT
        reply = ChatReply(self.runner, self.vocoder, request.messages, request.max_tokens, prompt, ref_audio)
        for piece in reply.pieces():
            yield SlotOutput(audio=piece.audio, text=piece.text, end_of_turn=piece.end_of_turn, cut_off=piece.cut_off)

    # -- the tick ----------------------------------------------------------------------------------------------

    def _prepare(self, slot: int, state: _UnitSlot) -> SlotOutput:
        assert self.runner is not None
        voice = state.config.voice
        ref_audio = _voice_audio(slot, voice)
        session = self.runner.new_session()
        self.runner.prepare(session, state.config.persona or DEFAULT_SYSTEM_PROMPT, ref_audio)
        state.vocoder = self.vocoder.new_state(ref_audio)
        state.session = session
        return SlotOutput(audio=np.zeros(0, np.float32), prefilling=False, progress=1.0)

    def _check_unit(self, slot: int, state: _UnitSlot, unit: SlotInput) -> tuple[np.ndarray, torch.Tensor | None, bool]:
        """Check one unit; returns (audio, frame embeddings or None, forced to listen)."""
        assert self.runner is not None and self.parts is not None and state.session is not None
        audio = np.asarray(unit.audio)
        if audio.shape != (UNIT_SAMPLES,) or not np.issubdtype(audio.dtype, np.floating):
            raise EngineError(
                f"slot {slot}: a unit is float [{UNIT_SAMPLES}] at 16 kHz, got {audio.dtype} {audio.shape}"
            )
        if not np.all(np.isfinite(audio)):
            raise EngineError(f"slot {slot}: audio contains NaN or infinity")
        frame_embeds = None
        if unit.image is not None:
            try:
                frame = decode_frame(unit.image, self.parts.config.image_size, self.parts.config.vision.patch_size)
                frame_embeds = self.parts.vision.embed_frame(frame)
            except FrameError as exc:
                # One bad camera frame must not end the call: this unit goes on audio-only.
                logger.warning("unit.frame_dropped", extra={"slot": slot, "reason": str(exc)})
        force = unit.force_listen or state.end_turn_requested or unit.turn == "listen"
        state.end_turn_requested = False
        if unit.turn == "respond" and not force:
            # Half-duplex (inference/turns): the model answers this turn; an unfinished turn cannot yield to
            # listen (duplex.py), so it speaks until it ends its turn. Keep this when reworking the unit loop.
            state.session.turn_ended = False
        return audio.astype(np.float32, copy=False), frame_embeds, force

    def _units_audio(self, units: list[tuple[_UnitSlot, UnitResult]]) -> list[np.ndarray]:
        """Each slot's audio of the tick: the speaking slots' codes go through the vocoder together (it batches
        their chunks), a listening slot's audio is empty."""
        audio = [np.zeros(0, np.float32) for _ in units]
        speaking = [k for k, (_, result) in enumerate(units) if not result.is_listen]
        spoken = self.vocoder.synthesize_many(
            [units[k][0].vocoder for k in speaking],
            [units[k][1].tts_codes for k in speaking],
            [units[k][1].end_of_turn for k in speaking],
        )
        for k, piece in zip(speaking, spoken, strict=True):
            audio[k] = piece
        return audio

    def _unit_output(self, state: _UnitSlot, result: UnitResult, force: bool, audio: np.ndarray) -> SlotOutput:
        if force and not result.end_of_turn:
            self.vocoder.new_turn(state.vocoder)
        return SlotOutput(
            audio=audio,
            text=result.text,
            decision="listen" if result.is_listen else "speak",
            end_of_turn=result.end_of_turn,
        )

    def _prepare_new_slots(self) -> dict[int, SlotOutput]:
        """Prepare newly opened slots in the order they opened, until this tick's prepares took
        ``prepare_share`` of the unit; the rest report that they are still preparing and go first next tick."""
        outputs: dict[int, SlotOutput] = {}
        started = time.perf_counter()
        budget_s = self.prepare_share * self.capabilities.chunk_period_ms / 1000.0
        for slot, state in self._slots.items():
            if state.session is not None:
                continue
            if outputs and time.perf_counter() - started >= budget_s:
                outputs[slot] = SlotOutput(audio=np.zeros(0, np.float32), prefilling=True, progress=0.0)
            else:
                outputs[slot] = self._prepare(slot, state)
        return outputs

    def step(self, inputs: Mapping[int, SlotInput]) -> dict[int, SlotOutput]:
        """Prepare newly opened slots (as many as ``prepare_share`` of the unit takes), then run one unit for each
        slot in ``inputs``.

        Every slot's unit is checked first (a bad one raises before any state moves), then the prefills and
        the decisions of all slots run together (the fast runner batches their LLM feeds and TTS), then the
        speaking slots' audio is synthesized together (the vocoder batches their chunks).
        """
        assert self.runner is not None
        outputs = self._prepare_new_slots()
        units: list[tuple[int, _UnitSlot, tuple[np.ndarray, torch.Tensor | None, bool]]] = []
        for slot, unit in inputs.items():
            state = self._slots.get(slot)
            if state is None:
                raise EngineError(f"step() got input for slot {slot}, which is not open")
            if slot in outputs:
                continue  # prepared this tick, or waiting for it: input before the prepare is not part of the call
            units.append((slot, state, self._check_unit(slot, state, unit)))
        self.runner.prefill_many([(state.session, audio, frame) for _, state, (audio, frame, _) in units])
        results = self.runner.generate_many([(state.session, force) for _, state, (_, _, force) in units])
        audio = self._units_audio([(state, result) for (_, state, _), result in zip(units, results, strict=True)])
        for (slot, state, (_, _, force)), result, unit_audio in zip(units, results, audio, strict=True):
            outputs[slot] = self._unit_output(state, result, force, unit_audio)
        return outputs

    def admissible_sessions(self) -> int | None:
        """With Token2Wav on a GPU: how many more sessions the device memory left takes; None elsewhere.

        The LLM's memory is taken at warm-up for every slot, the vocoder's grows as a session speaks: a prompt's
        caches, then its turn's, up to about 170 MB each at the published shapes with the built-in voice. At 64
        slots on an H200 the device had ~8 GiB left for them, and 45 calls ran it out (bench/notes/
        serving-e2e.md). So the live sessions' vocoders are counted at their longest, and room is kept for a
        batch (``VOCODER_BATCH_HEADROOM`` sessions' worth); each new session is counted as the built-in voice.
        """
        if self._vocoder_session_bytes is None or not isinstance(self.vocoder, Token2WavVocoder):
            return None
        growth = 0
        for state in self._slots.values():
            if state.vocoder.base_caches is None:  # open, its vocoder not made yet (the prepare tick)
                growth += self._vocoder_session_bytes
                continue
            now, longest = self.vocoder.state_bytes(state.vocoder)
            growth += longest - now
        spare = device_spare_bytes(self.device) - growth - VOCODER_BATCH_HEADROOM * self._vocoder_session_bytes
        return max(0, spare // self._vocoder_session_bytes)

    def watch_vocoder_memory(self) -> None:
        """Let device memory limit admission (``admissible_sessions``): measure a new session's vocoder."""
        assert isinstance(self.vocoder, Token2WavVocoder)
        self._vocoder_session_bytes = max(1, self.vocoder.state_bytes(self.vocoder.new_state(None))[1])

    def memory_snapshot(self) -> dict[str, float]:
        """Parameter bytes, per-session cache bytes, and device bytes when on CUDA."""
        snap: dict[str, float] = {}
        if self.parts is not None:
            snap["parameters_bytes"] = float(self.parts.parameter_bytes())
        snap["sessions_bytes"] = float(sum(s.session.nbytes() for s in self._slots.values() if s.session))
        if self.device.startswith("cuda") and torch.cuda.is_available():
            snap["cuda_allocated_bytes"] = float(torch.cuda.memory_allocated())
        return snap

    def session_of(self, slot: int) -> DuplexSession | None:
        """The model session of ``slot`` (tests and benches inspect caches through it)."""
        state = self._slots.get(slot)
        return None if state is None else state.session

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise EngineError(f"slot {slot} out of range 0..{self.num_slots - 1}")


def device_spare_bytes(device: str) -> int:
    """Device memory a new allocation can take: free on the device, and cached by torch but unused."""
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def _voice_audio(slot: int, voice: VoiceRef | None) -> np.ndarray | None:
    """The voice's reference clip (the TTS / vocoder prompt), or None for the built-in one."""
    if voice is None or voice.path is None:
        return None
    try:
        return load_reference_audio(Path(voice.path))
    except (OSError, ValueError, RuntimeError) as exc:
        raise EngineError(f"slot {slot}: cannot read voice {voice.voice_id!r}: {exc}") from exc
