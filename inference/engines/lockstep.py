"""The lockstep engine: Moshi / PersonaPlex sessions as slots of one batch, one 80 ms frame per tick.

Each tick: batched Mimi encode of the live slots' audio -> one ``LockstepGen.step`` over all slots (live slots
forced with their user codes, joining slots with their next prefill frame, everyone else frozen by the
execution mask) -> batched Mimi decode of the agent codes. A joining PersonaPlex slot's prefill (voice prompt,
persona) rides along in the shared step, plus extra prefill-only steps while the tick stays within
``prefill_budget_ms``, so it never stalls the slots already talking for more than that budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from inference.engines.base import (
    Engine,
    EngineCapabilities,
    EngineError,
    ProgressFn,
    SlotConfig,
    SlotInput,
    SlotOutput,
)
from inference.models.moshi.config import CheckpointError, CheckpointInfo, read_checkpoint_dir
from inference.models.moshi.gen import LockstepGen, SamplingConfig
from inference.models.moshi.personaplex import (
    DEFAULT_PERSONA,
    MAX_VOICE_FRAMES,
    SILENCE_TOKENS,
    PrefillFrame,
    VoicePromptError,
    build_prefill,
    iter_voice_frames_from_pcm,
    load_voice_prompt,
    persona_tokens,
    voice_frames_from_prompt,
)
from inference.models.moshi.text import TextDetokenizer

logger = logging.getLogger(__name__)

SAMPLE_RATE = 24_000
FRAME_SAMPLES = 1920
FRAME_MS = 80
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DEMO_NOTICE = (
    "Random demo weights: the agent babbles. To serve a real model, set PARLEY_CHECKPOINT to a checkpoint "
    "directory in the Kyutai layout (config.json, model.safetensors, Mimi and tokenizer files), e.g. a local "
    "copy of kyutai/moshiko-pytorch-bf16 or nvidia/personaplex-7b-v1, and PARLEY_ENGINE=moshi or personaplex."
)


@dataclass
class _Slot:
    """What the engine keeps for one open slot."""

    prefill: Iterator[PrefillFrame] | None
    prefill_total: int
    prefill_done: int = 0
    live: bool = False


class LockstepEngine(Engine):
    """Moshi (dep_q 8) or PersonaPlex (dep_q 16) served as a fixed batch of slots.

    Args:
        checkpoint: checkpoint directory in the Kyutai layout.
        num_slots: batch size.
        device: torch device string.
        dtype: ``float32`` or ``bfloat16`` for the LM (Mimi runs in float32).
        greedy: argmax decoding instead of the checkpoint's sampling defaults.
        prefill_budget_ms: a tick may spend up to this long on extra prefill-only steps.
        seed: sampling RNG seed.
    """

    def __init__(
        self,
        checkpoint: Path,
        num_slots: int,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        greedy: bool = False,
        prefill_budget_ms: float = 30.0,
        seed: int = 0,
    ):
        if num_slots < 1:
            raise EngineError("num_slots must be >= 1")
        if dtype not in DTYPES:
            raise EngineError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        try:
            self.info: CheckpointInfo = read_checkpoint_dir(checkpoint)
        except CheckpointError as exc:
            raise EngineError(f"cannot use checkpoint {checkpoint}: {exc}") from exc
        self.num_slots = num_slots
        self.device = device
        self.dtype = DTYPES[dtype]
        self.greedy = greedy
        self.prefill_budget_ms = prefill_budget_ms
        self.seed = seed
        self.capabilities = self._capabilities()
        self._slots: dict[int, _Slot] = {}
        self.gen: LockstepGen | None = None

    @classmethod
    def from_config(cls, config) -> LockstepEngine:  # config: inference.config.InferenceConfig
        """Build from the service configuration (checkpoint, slots, device, dtype)."""
        if config.checkpoint is None:
            raise EngineError("the lockstep engine needs PARLEY_CHECKPOINT (a Moshi / PersonaPlex checkpoint dir)")
        return cls(Path(config.checkpoint), config.slots, device=config.device, dtype=config.dtype)

    def _capabilities(self) -> EngineCapabilities:
        lm = self.info.lm
        demo = self.info.demo_weights
        extra = {"dep_q": lm.dep_q, "persona": lm.personaplex, "voice_prompt": lm.personaplex, "demo_weights": demo}
        if demo:
            extra["demo_notice"] = DEMO_NOTICE
        return EngineCapabilities(
            engine="personaplex" if lm.personaplex else "moshi",
            family="lockstep",
            chunk_period_ms=FRAME_MS,
            input_rate=SAMPLE_RATE,
            input_chunk_samples=FRAME_SAMPLES,
            output_rate=SAMPLE_RATE,
            barge_in=False,
            demo_weights=demo,
            extra=extra,
        )

    # ---- lifecycle -------------------------------------------------------------------------------

    def warmup(self, progress: ProgressFn | None = None) -> None:
        """Load the LM, Mimi and tokenizer, then run two throw-away ticks over every slot."""
        import sentencepiece as spm

        from inference.models.moshi.loading import load_lm
        from inference.models.moshi.mimi import MimiConfig, load_mimi
        from inference.models.moshi.mimi_loading import MimiLoadError

        report = progress or (lambda fraction, stage: None)
        if self.device == "cpu":
            # Latency-bound steps: extra intra-op threads only spin against each other (process-wide knob).
            torch.set_num_threads(1)
        report(0.0, "loading the LM")
        info = self.info
        try:
            lm = load_lm(info.moshi_weights, info.lm, device=self.device, dtype=self.dtype)
            report(0.5, "loading Mimi")
            mimi_config = MimiConfig.from_dict(info.mimi_config) if info.mimi_config else MimiConfig.kyutai_default()
            self.codec = load_mimi(info.mimi_weights, mimi_config, num_codebooks=8, device=self.device)
            self.tokenizer = spm.SentencePieceProcessor(model_file=str(info.tokenizer))
        except (CheckpointError, MimiLoadError, OSError, RuntimeError) as exc:
            raise EngineError(f"cannot load {info.directory}: {exc}") from exc
        self.detokenizer = TextDetokenizer(self.tokenizer)
        sampling = SamplingConfig.from_lm_gen_config(info.lm_gen_config, greedy=self.greedy)
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        self.gen = LockstepGen(lm, self.num_slots, sampling, generator)
        self.mimi_state = self.codec.init_stream(self.num_slots)
        B, K = self.num_slots, info.lm.num_codebooks
        self._user_mask = torch.zeros(B, K, dtype=torch.bool, device=self.device)
        self._user_mask[:, K - 8 :] = True
        self._silence_codes = torch.tensor(SILENCE_TOKENS, device=self.device).view(1, 8).expand(B, 8)
        report(0.8, "warming up the step")
        everyone = torch.ones(B, dtype=torch.bool, device=self.device)
        for _ in range(2):
            codes = self.codec.encode_step(torch.zeros(B, 1, FRAME_SAMPLES, device=self.device), self.mimi_state)
            forced = torch.zeros(B, K, dtype=torch.long, device=self.device)
            forced[:, K - 8 :] = codes[:, :, 0]
            out = self.gen.step(forced, self._user_mask, everyone)
            self.codec.decode_step(
                self._agent_codes(out.tokens, out.valid)[:, :, None], self.mimi_state, validate=False
            )
        self.gen.reset(everyone)
        self.mimi_state.reset(everyone.cpu())
        if info.demo_weights:
            logger.warning("lockstep.demo_weights %s", DEMO_NOTICE)
        report(1.0, f"{self.capabilities.engine} ready")

    def open_slot(self, slot: int, config: SlotConfig) -> None:
        """Reset the slot's rows and queue its prefill (PersonaPlex: voice prompt, persona; Moshi: none)."""
        self._check_slot(slot)
        if self.gen is None:
            raise EngineError("open_slot() before warmup()")
        if slot in self._slots:
            raise EngineError(f"slot {slot} is already open")
        prefill, total = self._make_prefill(config)
        self._reset_rows([slot])
        self._slots[slot] = _Slot(prefill=prefill, prefill_total=total)

    def close_slot(self, slot: int) -> None:
        """Forget the slot; its rows are frozen until the next open resets them."""
        self._check_slot(slot)
        self._slots.pop(slot, None)

    def _make_prefill(self, config: SlotConfig) -> tuple[Iterator[PrefillFrame] | None, int]:
        lm_config = self.info.lm
        if not lm_config.personaplex:
            return None, 0  # Moshiko has no system prompt: live from the first tick
        voice_frames: list[PrefillFrame] = []
        voice_iter: Iterator[PrefillFrame] | None = None
        voice_count = 0
        path = config.voice.path if config.voice is not None else None
        try:
            if path is not None and Path(path).suffix.lower() == ".wav":
                from inference.models.moshi.audio_prep import load_voice_wav

                pcm = load_voice_wav(path)
                if len(pcm) > MAX_VOICE_FRAMES * FRAME_SAMPLES:
                    raise VoicePromptError(f"{path}: voice prompt longer than {MAX_VOICE_FRAMES * FRAME_MS // 1000} s")
                voice_count = max(0, -(-len(pcm) // FRAME_SAMPLES) - 1)
                voice_iter = iter_voice_frames_from_pcm(self.codec, pcm, lm_config)
            elif path is not None:
                assert self.gen is not None
                voice_frames = voice_frames_from_prompt(lm_config, load_voice_prompt(path, lm_config, self.gen.ct))
                voice_count = len(voice_frames)
            ids = persona_tokens(self.tokenizer, config.persona or DEFAULT_PERSONA)
        except ValueError as exc:  # VoicePromptError, AudioPrepError, LoudnessError, empty persona
            raise EngineError(f"cannot prepare the session: {exc}") from exc
        rest = build_prefill(lm_config, voice=voice_frames, persona_ids=ids).frames
        frames: Iterator[PrefillFrame] = iter(rest) if voice_iter is None else _chain(voice_iter, rest)
        return frames, len(rest) + (voice_count if voice_iter is not None else 0)

    # ---- the tick --------------------------------------------------------------------------------

    def step(self, inputs: Mapping[int, SlotInput]) -> dict[int, SlotOutput]:
        """One tick: live slots in ``inputs`` get a frame each; prefilling slots advance; others stay frozen."""
        if self.gen is None:
            raise EngineError("step() before warmup()")
        started = time.perf_counter()
        B, K, dev = self.num_slots, self.info.lm.num_codebooks, self.device
        for slot in inputs:
            if slot not in self._slots:
                raise EngineError(f"step() got input for slot {slot}, which is not open")
        live = [s for s in inputs if self._slots[s].live]
        prefilling = [s for s, st in self._slots.items() if not st.live]
        outputs: dict[int, SlotOutput] = {}
        forced = torch.zeros(B, K, dtype=torch.long)
        mask = torch.zeros(B, K, dtype=torch.bool)
        exec_mask = torch.zeros(B, dtype=torch.bool)
        step_out = None
        # live slots left out of this tick (paused, detached): their codec rows must not move either
        frozen = [s for s, st in self._slots.items() if st.live and s not in inputs]
        saved = _save_rows(self.mimi_state, frozen) if live and frozen else None
        if live:
            pcm = torch.zeros(B, 1, FRAME_SAMPLES)
            for s in live:
                pcm[s, 0] = torch.from_numpy(self._check_audio(s, inputs[s].audio))
            codes = self.codec.encode_step(pcm.to(dev), self.mimi_state)[:, :, 0].cpu()  # [B, 8]
            for s in live:
                forced[s, K - 8 :], mask[s, K - 8 :], exec_mask[s] = codes[s], True, True
        # the joining slots' next prefill frame rides along in the same batched step
        finished = self._step_with_prefill(forced, mask, exec_mask, prefilling, live_in_step=bool(live))
        if live:
            step_out = self._last_out
        # extra prefill-only steps while the tick has budget left
        while prefilling and any(not self._slots[s].live for s in prefilling if s in self._slots):
            elapsed_ms = (time.perf_counter() - started) * 1000.0
            if elapsed_ms + self._last_step_ms > self.prefill_budget_ms:
                break
            zero = torch.zeros(B, K, dtype=torch.long)
            finished += self._step_with_prefill(
                zero, torch.zeros(B, K, dtype=torch.bool), torch.zeros(B, dtype=torch.bool), prefilling, False
            )
        if live and step_out is not None:
            agent = self._agent_codes(step_out.tokens, step_out.valid)
            pcm_out = self.codec.decode_step(agent[:, :, None], self.mimi_state, validate=False)[:, 0].cpu().numpy()
            if saved is not None:
                _restore_rows(self.mimi_state, saved)
            tokens = step_out.tokens[:, 0].cpu().tolist()
            valid = step_out.valid.cpu().tolist()
            for s in live:
                text = self.detokenizer.piece(tokens[s]) if valid[s] else ""
                outputs[s] = SlotOutput(audio=pcm_out[s].astype(np.float32, copy=True), text=text)
        for s in prefilling:
            st = self._slots.get(s)
            if st is None:
                continue
            if s in finished or st.live:
                outputs[s] = SlotOutput(audio=np.zeros(0, dtype=np.float32), prefilling=False, progress=1.0)
            else:
                progress = st.prefill_done / max(st.prefill_total, 1)
                outputs[s] = SlotOutput(audio=np.zeros(0, dtype=np.float32), prefilling=True, progress=progress)
        return outputs

    def _step_with_prefill(self, forced, mask, exec_mask, prefilling: list[int], live_in_step: bool) -> list[int]:
        """One batched LM step; prefilling slots contribute their next frame. Returns slots whose prefill ended."""
        assert self.gen is not None
        B, dim, dev = self.num_slots, self.info.lm.dim, self.device
        embeddings = torch.zeros(B, 1, dim)
        use_emb = torch.zeros(B, dtype=torch.bool)
        restores: list[tuple[int, torch.Tensor]] = []
        finished: list[int] = []
        for s in prefilling:
            st = self._slots.get(s)
            if st is None or st.live:
                continue
            frame = next(st.prefill, None) if st.prefill is not None else None
            if frame is None:
                finished.append(s)
                continue
            forced[s], mask[s], exec_mask[s] = frame.forced, frame.forced_mask, True
            if frame.embedding is not None:
                embeddings[s], use_emb[s] = frame.embedding, True
            if frame.restore_cache_after is not None:
                restores.append((s, frame.restore_cache_after))
            st.prefill_done += 1
        if bool(exec_mask.any()) or live_in_step:
            t0 = time.perf_counter()
            self._last_out = self.gen.step(
                forced.to(dev), mask.to(dev), exec_mask.to(dev), embeddings.to(dev, self.dtype), use_emb.to(dev)
            )
            self._last_step_ms = (time.perf_counter() - t0) * 1000.0
        for s, cache in restores:
            self.gen.restore_token_cache(s, cache)
        for s in finished:
            self._slots[s].live = True
            # the live audio starts from fresh codec streams, as the reference resets Mimi after the prompts
            mask_rows = torch.zeros(B, dtype=torch.bool)
            mask_rows[s] = True
            self.mimi_state.reset(mask_rows)
        return finished

    _last_out = None
    _last_step_ms = 0.0

    # ---- helpers ----------------------------------------------------------------------------------

    def _agent_codes(self, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Agent codebooks 0..7 [B, 8]; rows without a valid frame, or holding non-codec ids, become silence."""
        agent = tokens[:, 1:9]
        ok = valid.view(-1, 1) & (agent >= 0) & (agent < self.codec.cardinality)
        return torch.where(ok, agent, self._silence_codes.to(agent))

    def _reset_rows(self, slots: list[int]) -> None:
        assert self.gen is not None
        mask = torch.zeros(self.num_slots, dtype=torch.bool)
        mask[slots] = True
        self.gen.reset(mask.to(self.device))
        self.mimi_state.reset(mask)

    def _check_audio(self, slot: int, audio: np.ndarray) -> np.ndarray:
        if not isinstance(audio, np.ndarray) or audio.shape != (FRAME_SAMPLES,):
            shape = getattr(audio, "shape", type(audio).__name__)
            raise EngineError(f"slot {slot}: expected {FRAME_SAMPLES} samples, got {shape}")
        # non-finite samples would poison the codec state for good: treat them as silence
        return np.nan_to_num(audio.astype(np.float32, copy=False), nan=0.0, posinf=0.0, neginf=0.0)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise EngineError(f"slot {slot} out of range 0..{self.num_slots - 1}")

    def memory_snapshot(self) -> dict[str, float]:
        """KV ring and weight bytes of the LM."""
        if self.gen is None:
            return {}
        kv = self.gen.kv.keys.numel() * self.gen.kv.keys.element_size() * 2
        weights = sum(p.numel() * p.element_size() for p in self.gen.lm.parameters())
        return {"lm_kv_bytes": float(kv), "lm_weight_bytes": float(weights)}


def _state_tensors(obj, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor inside a codec stream state, with a stable path (the state is plain objects and lists)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            yield from _state_tensors(item, f"{path}[{i}]")
    elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
        for name, value in vars(obj).items():
            yield from _state_tensors(value, f"{path}.{name}")


def _save_rows(state, rows: list[int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Copies of the given batch rows of every per-row tensor of a Mimi stream state.

    Mimi has no execution mask, so a frozen slot's rows are saved before a batched codec call and put back
    after it; the slot then resumes exactly where it paused.
    """
    B = state.batch_size
    index = torch.tensor(rows, dtype=torch.long)
    saved = {p: t[index.to(t.device)].clone() for p, t in _state_tensors(state) if t.dim() and t.shape[0] == B}
    return index, saved


def _restore_rows(state, saved: tuple[torch.Tensor, dict[str, torch.Tensor]]) -> None:
    index, values = saved
    tensors = dict(_state_tensors(state))
    for path, value in values.items():
        target = tensors[path]
        target[index.to(target.device)] = value


def _chain(first: Iterator[PrefillFrame], rest: list[PrefillFrame]) -> Iterator[PrefillFrame]:
    yield from first
    yield from rest


__all__ = ["LockstepEngine", "VoicePromptError"]
