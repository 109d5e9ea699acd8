"""The lockstep engine: Moshi / PersonaPlex sessions as slots of one batch, one 80 ms frame per tick.

Each tick is one backend pass over the active slots (``lockstep_backends``): batched Mimi encode of the live
slots' audio -> one LM step (live slots forced with their user codes, joining slots with their next prefill
frame; every other slot frozen) -> batched Mimi decode of the agent codes. A joining PersonaPlex slot's prefill
(voice prompt, persona) rides along in the shared pass, plus extra prefill-only passes while the tick stays
within ``prefill_budget_ms``, so it never stalls the slots already talking for more than that budget.

This module decides what a tick does; the backend does the device work: by default the fast path (CUDA graphs
and Triton kernels on a GPU, their torch twins on CPU), or the eager ``LockstepGen`` it is tested against
(``PARLEY_LOCKSTEP_BACKEND=eager``); ``lockstep_backend_choice.choose_backend`` picks. The checkpoint as served
(its context, the capabilities announced) is ``lockstep_checkpoint``'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from inference.engines.base import (
    Engine,
    EngineCapacity,
    EngineError,
    ProgressFn,
    SlotConfig,
    SlotInput,
    SlotOutput,
)
from inference.engines.lockstep_backend_choice import choose_backend
from inference.engines.lockstep_backends import BACKENDS, USER_CODEBOOKS, LockstepBackend, StepRows
from inference.engines.lockstep_checkpoint import (
    DEMO_NOTICE,
    FRAME_MS,
    check_prompt_fits,
    lockstep_capabilities,
    read_served_checkpoint,
)
from inference.engines.lockstep_fast_backend import KVPaging
from inference.engines.lockstep_prefill import slot_prefill
from inference.engines.prefill_cache import DEFAULT_MAX_ENTRIES, PrefillCache, restore_slot, snapshot_slot, start_key
from inference.models.moshi.config import CheckpointError, CheckpointInfo
from inference.models.moshi.fast.step import FastLockstep
from inference.models.moshi.gen import LockstepGen, SamplingConfig
from inference.models.moshi.personaplex import (
    DEFAULT_PERSONA,
    FRAME_SAMPLES,
    PrefillFrame,
    VoicePromptError,
)
from inference.models.moshi.text import TextDetokenizer

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
KV_DTYPES: dict[str, bool | None] = {"auto": None, "fp8": True, "bf16": False}  # PARLEY_KV_DTYPE -> kv_fp8


@dataclass
class _Slot:
    """What the engine keeps for one open slot."""

    prefill: Iterator[PrefillFrame] | None
    prefill_total: int
    prefill_done: int = 0
    live: bool = False
    start_key: str | None = None  # where the state after this prefill goes in the prefill cache


class LockstepEngine(Engine):
    """Moshi (dep_q 8) or PersonaPlex (dep_q 16) served as a fixed batch of slots.

    Args:
        checkpoint: checkpoint directory in the Kyutai layout.
        num_slots: batch size.
        device: torch device string.
        dtype: ``float32`` or ``bfloat16`` for the LM (Mimi runs in float32).
        greedy: argmax decoding instead of the checkpoint's sampling defaults.
        prefill_budget_ms: a tick may spend up to this long (from its start) on extra prefill-only passes.
        seed: sampling RNG seed.
        backend: ``auto`` (= ``fast``: graphed on CUDA, torch twins on CPU) or ``eager`` (the native reference).
        kv_fp8: fast path KV rings in fp8; None means on for bfloat16 on CUDA.
        prefill_cache_entries: instant starts kept (``prefill_cache``); 0 turns the cache off.
        context: frames the model attends to, below the checkpoint's own (None or 0: the checkpoint's); the KV
            ring, its pages and admission all follow it (``PARLEY_LOCKSTEP_CONTEXT``).
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
        backend: str = "auto",
        kv_fp8: bool | None = None,
        kv_paging: KVPaging | None = None,
        prefill_cache_entries: int = DEFAULT_MAX_ENTRIES,
        context: int | None = None,
    ):
        if num_slots < 1:
            raise EngineError("num_slots must be >= 1")
        if dtype not in DTYPES:
            raise EngineError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if backend not in BACKENDS:
            raise EngineError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.info: CheckpointInfo
        self.info, self.context_shortened = read_served_checkpoint(checkpoint, context)
        self.num_slots = num_slots
        self.device = device
        self.dtype = DTYPES[dtype]
        self.greedy = greedy
        self.prefill_budget_ms = prefill_budget_ms
        self.seed = seed
        self.requested_backend = backend
        self.kv_fp8 = kv_fp8
        self.kv_paging = kv_paging or KVPaging()
        self.capabilities = lockstep_capabilities(self.info)
        self._slots: dict[int, _Slot] = {}
        self.backend: LockstepBackend | None = None
        self._prefill_pass_ms = 0.0  # measured cost of one prefill-only pass (warm-up, then every such pass)
        self.prefill_cache = PrefillCache(prefill_cache_entries)

    @classmethod
    def from_config(cls, config) -> LockstepEngine:  # config: inference.config.InferenceConfig
        """Build from the service configuration (checkpoint, slots, device, dtype)."""
        if config.checkpoint is None:
            raise EngineError("the lockstep engine needs PARLEY_CHECKPOINT (a Moshi / PersonaPlex checkpoint dir)")
        return cls(
            Path(config.checkpoint),
            config.slots,
            device=config.device,
            dtype=config.dtype,
            greedy=getattr(config, "greedy", False),
            backend=config.lockstep_backend,
            kv_fp8=KV_DTYPES[getattr(config, "kv_dtype", "auto")],
            context=getattr(config, "lockstep_context", 0),
            kv_paging=KVPaging(
                page_frames=config.kv_page_frames,
                pool_gb=config.kv_pool_gb,
                mean_call_frames=round(config.kv_mean_call_s * 1000 / FRAME_MS),
            ),
        )

    @property
    def gen(self) -> LockstepGen | FastLockstep | None:
        """The backend's generation state: ``cache`` / ``provided`` / ``lengths`` per slot (None before warm-up)."""
        return None if self.backend is None else self.backend.state

    @property
    def codec(self):
        """The Mimi codec (after warm-up)."""
        if self.backend is None:
            raise EngineError("the codec is loaded by warmup()")
        return self.backend.codec

    # ---- lifecycle -------------------------------------------------------------------------------

    def warmup(self, progress: ProgressFn | None = None, *, loaded: tuple | None = None) -> None:
        """Load the LM, Mimi and tokenizer, build the backend and warm it (graphs captured on CUDA).

        Args:
            progress: called with (fraction, stage) as loading goes on.
            loaded: (lm, codec, tokenizer) already in memory instead of the checkpoint's files: the GPU bench
                serves random 7B weights through this very path without writing 16 GB to disk first.
        """
        import sentencepiece as spm

        from inference.models.moshi.loading import load_lm
        from inference.models.moshi.mimi_config import MimiConfig
        from inference.models.moshi.mimi_loading import MimiLoadError, load_mimi

        report = progress or (lambda fraction, stage: None)
        if self.device == "cpu":
            # Latency-bound steps: extra intra-op threads only spin against each other (process-wide knob).
            torch.set_num_threads(1)
        report(0.0, "loading the LM")
        info = self.info
        if loaded is not None:
            lm, codec, self.tokenizer = loaded
            if lm.config.context != info.lm.context:
                raise EngineError(
                    f"the LM handed in has a context of {lm.config.context}, the engine {info.lm.context}"
                )
        else:
            try:
                lm = load_lm(info.moshi_weights, info.lm, device=self.device, dtype=self.dtype)
                report(0.5, "loading Mimi")
                mimi_config = (
                    MimiConfig.from_dict(info.mimi_config) if info.mimi_config else MimiConfig.kyutai_default()
                )
                codec = load_mimi(info.mimi_weights, mimi_config, num_codebooks=8, device=self.device)
                self.tokenizer = spm.SentencePieceProcessor(model_file=str(info.tokenizer))
            except (CheckpointError, MimiLoadError, OSError, RuntimeError) as exc:
                raise EngineError(f"cannot load {info.directory}: {exc}") from exc
        self.detokenizer = TextDetokenizer(self.tokenizer)
        sampling = SamplingConfig.from_lm_gen_config(info.lm_gen_config, greedy=self.greedy)
        backend = choose_backend(
            self.requested_backend,
            lm,
            codec,
            self.num_slots,
            sampling,
            kv_fp8=self.kv_fp8,
            seed=self.seed,
            paging=self.kv_paging,
        )
        report(0.7, f"warming up the {backend.name} step")
        backend.warmup()
        self._prefill_pass_ms = self._time_prefill_pass(backend)
        self.backend = backend
        if info.demo_weights:
            logger.warning("lockstep.demo_weights %s", DEMO_NOTICE)
        logger.info("lockstep.ready", extra={"backend": backend.name, "prefill_pass_ms": self._prefill_pass_ms})
        report(1.0, f"{self.capabilities.engine} ready ({backend.name} path)")

    def _time_prefill_pass(self, backend: LockstepBackend) -> float:
        """Time a one-row prefill-like pass on slot 0 (the first budget estimate), then reset slot 0."""
        K = self.info.lm.num_codebooks
        rows = StepRows([0], torch.zeros(1, K, dtype=torch.long), torch.zeros(1, K, dtype=torch.bool))
        backend.step(rows)
        started = time.perf_counter()
        backend.step(rows)
        elapsed = (time.perf_counter() - started) * 1000.0
        backend.reset_slot(0)
        return elapsed

    def open_slot(self, slot: int, config: SlotConfig) -> None:
        """Reset the slot's rows and queue its prefill (PersonaPlex: voice prompt, persona; Moshi: none)."""
        self._check_slot(slot)
        if self.backend is None:
            raise EngineError("open_slot() before warmup()")
        if slot in self._slots:
            raise EngineError(f"slot {slot} is already open")
        key = None
        if self.info.lm.personaplex and self.prefill_cache.max_entries > 0:
            try:
                key = start_key(self.info.directory, config, DEFAULT_PERSONA)
            except OSError as exc:
                raise EngineError(f"cannot prepare the session: {exc}") from exc
        snapshot = self.prefill_cache.get(key) if key is not None else None
        self.backend.reset_slot(slot)
        if not self.backend.claim_kv(slot):
            raise EngineError("no KV memory is free for another session; try again when a call ends")
        if snapshot is not None:  # instant start: the state after this very prefill, copied in
            try:
                restore_slot(self.backend.state, slot, snapshot)
            except RuntimeError as exc:  # not enough KV pages for the copied context
                self.backend.release_kv(slot)
                raise EngineError(f"cannot start the session: {exc}") from exc
            self._slots[slot] = _Slot(prefill=None, prefill_total=0, live=True)
            return
        try:
            prefill, total = slot_prefill(self.info.lm, self.tokenizer, self.backend, config)
            check_prompt_fits(self.info, total, self.context_shortened)
        except EngineError:
            self.backend.release_kv(slot)
            raise
        self._slots[slot] = _Slot(prefill=prefill, prefill_total=total, start_key=key)

    def live_at_open(self, slot: int) -> bool:
        """A prefill-cache hit starts the slot live (instant start): it takes input from its first tick."""
        return slot in self._slots and self._slots[slot].live

    def prepare_start(self, config: SlotConfig) -> bool:
        """Prefill ``config`` on an idle slot and keep the state in the prefill cache, then free the slot.

        Called before the engine's worker runs (``inference.embedded``'s warm start), so no tick competes.

        Raises:
            EngineError: as ``open_slot`` (an unreadable voice, an empty persona) or no slot is idle.
        """
        if not self.info.lm.personaplex or self.prefill_cache.max_entries <= 0:
            return False  # Moshiko has no prefill; a disabled cache keeps nothing
        slot = next((s for s in range(self.num_slots) if s not in self._slots), None)
        if slot is None:
            raise EngineError("no idle slot to prepare a start on")
        self.open_slot(slot, config)  # a start already cached opens live: nothing to do
        try:
            while not self._slots[slot].live:
                self.step({})  # prefill-only ticks; the last one puts the state into the cache
        finally:
            self.close_slot(slot)
        return True

    def close_slot(self, slot: int) -> None:
        """Forget the slot and give back its KV pages; its rows are frozen until the next open resets them."""
        self._check_slot(slot)
        self._slots.pop(slot, None)
        if self.backend is not None:
            self.backend.release_kv(slot)

    def capacity(self) -> EngineCapacity:
        """Sessions the backend's KV admits at full context and at the call mix (slots before warm-up)."""
        return EngineCapacity.by_slots(self.num_slots) if self.backend is None else self.backend.capacity()

    def admissible_sessions(self) -> int | None:
        """How many more sessions the paged KV admits now (None: only the slot count limits it)."""
        return None if self.backend is None else self.backend.admissible_sessions()

    # ---- the tick --------------------------------------------------------------------------------

    def step(self, inputs: Mapping[int, SlotInput]) -> dict[int, SlotOutput]:
        """One tick: live slots in ``inputs`` get a frame each; prefilling slots advance; others stay frozen."""
        if self.backend is None:
            raise EngineError("step() before warmup()")
        started = time.perf_counter()
        for slot in inputs:
            if slot not in self._slots:
                raise EngineError(f"step() got input for slot {slot}, which is not open")
        live = [s for s in inputs if self._slots[s].live]
        prefilling = [s for s, st in self._slots.items() if not st.live]
        # live slots left out of this tick (paused, detached): their codec rows must not move either
        frozen = [s for s, st in self._slots.items() if st.live and s not in inputs] if live else []
        pcm = torch.from_numpy(self._stack_audio(live, inputs)) if live else None
        outputs: dict[int, SlotOutput] = {}
        # the joining slots' next prefill frame rides along in the live pass
        result, finished = self._pass(live, prefilling, pcm, frozen)
        if live:
            assert result is not None and result.pcm is not None
            pcm_out = result.pcm.numpy()
            every = result.tokens.tolist()  # [rows][text + codebooks]
            valid = result.valid.tolist()
            for row, s in enumerate(live):
                text = self.detokenizer.piece(every[row][0]) if valid[row] else ""
                # a view: pcm_out is this tick's own host array, nothing writes it again
                outputs[s] = SlotOutput(audio=pcm_out[row], text=text, tokens=tuple(every[row]))
        # extra prefill-only passes while the tick has budget left
        while any(s in self._slots and not self._slots[s].live for s in prefilling):
            elapsed_ms = (time.perf_counter() - started) * 1000.0
            if elapsed_ms + self._prefill_pass_ms > self.prefill_budget_ms:
                break
            t0 = time.perf_counter()
            result, done = self._pass([], prefilling, None, [])
            if result is not None:  # backend passes return once done on the device: this is the real cost
                self._prefill_pass_ms = (time.perf_counter() - t0) * 1000.0
            finished += done
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

    def _pass(self, live: list[int], prefilling: list[int], pcm, frozen: Sequence[int]):
        """One backend pass: ``live`` rows (user codes from ``pcm``) then each prefilling slot's next frame.

        Returns (the pass's result or None when no row ran, slots whose prefill ended).
        """
        assert self.backend is not None
        K, dim = self.info.lm.num_codebooks, self.info.lm.dim
        frames: list[tuple[int, PrefillFrame]] = []
        finished: list[int] = []
        for s in prefilling:
            st = self._slots.get(s)
            if st is None or st.live:
                continue
            frame = next(st.prefill, None) if st.prefill is not None else None
            if frame is None:
                finished.append(s)
                continue
            frames.append((s, frame))
            st.prefill_done += 1
        result = None
        n_live = len(live)
        if live or frames:
            # live rows in bulk (their user columns are filled on the device from this tick's codes), then one
            # row per prefill frame: no per-live-row host work, which matters at 100+ slots
            forced = torch.zeros(n_live + len(frames), K, dtype=torch.long)
            mask = torch.zeros(n_live + len(frames), K, dtype=torch.bool)
            mask[:n_live, K - USER_CODEBOOKS :] = True
            for row, (_, frame) in enumerate(frames, start=n_live):
                forced[row], mask[row] = frame.forced, frame.forced_mask
            rows = StepRows(list(live) + [s for s, _ in frames], forced, mask, num_live=n_live)
            if any(frame.embedding is not None for _, frame in frames):
                rows.embeddings = torch.zeros(len(rows.slots), dim)
                rows.use_embeddings = torch.zeros(len(rows.slots), dtype=torch.bool)
                for row, (_, frame) in enumerate(frames, start=n_live):
                    if frame.embedding is not None:
                        rows.embeddings[row], rows.use_embeddings[row] = frame.embedding.reshape(dim), True
            result = self.backend.step(rows, pcm, frozen)
        restores = [(s, f.restore_cache_after) for s, f in frames if f.restore_cache_after is not None]
        for s, cache in restores:
            self.backend.restore_token_cache(s, cache)
        for s in finished:
            st = self._slots[s]
            st.live = True
            if st.start_key is not None:  # the state right after the prefill: later identical starts copy it
                self.prefill_cache.put(st.start_key, snapshot_slot(self.backend.state, s))
            # the live audio starts from fresh codec streams, as the reference resets Mimi after the prompts
            # (after this tick's decode, so the first live frame meets a fresh decoder too)
            self.backend.reset_codec(s)
        return result, finished

    # ---- helpers ----------------------------------------------------------------------------------

    def _stack_audio(self, live: list[int], inputs: Mapping[int, SlotInput]) -> np.ndarray:
        """The live slots' frames as one [n, FRAME_SAMPLES] float32 array, non-finite samples as silence."""
        for s in live:
            audio = inputs[s].audio
            if not isinstance(audio, np.ndarray) or audio.shape != (FRAME_SAMPLES,):
                shape = getattr(audio, "shape", type(audio).__name__)
                raise EngineError(f"slot {s}: expected {FRAME_SAMPLES} samples, got {shape}")
        frames = np.stack([inputs[s].audio for s in live]).astype(np.float32, copy=False)
        # non-finite samples would poison the codec state for good: treat them as silence (one pass for all
        # slots: per slot, nan_to_num was the largest host cost of a 128-session tick)
        return np.nan_to_num(frames, copy=False, nan=0.0, posinf=0.0, neginf=0.0)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise EngineError(f"slot {slot} out of range 0..{self.num_slots - 1}")

    def memory_snapshot(self) -> dict[str, float]:
        """KV ring and weight bytes of the LM."""
        if self.backend is None:
            return {}
        return self.backend.memory_snapshot()


__all__ = ["LockstepEngine", "VoicePromptError"]
