"""The inference service: one engine, its worker thread, the slot pool and every user's session.

In the embedded default ``inference.api`` runs one ``InferenceService`` in the web process. With
``PARLEY_INFERENCE_URL=unix:///path.sock`` the web tier talks to ``python -m inference serve``,
which runs the very same object behind a unix socket (``inference.transport.server``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time

from inference.config import InferenceConfig
from inference.contracts import EngineCapabilities, ParleyError, SessionRequest, SlotSnapshot, WorkerSnapshot
from inference.engines import build_engine
from inference.engines.base import Engine, ProgressFn
from inference.recording.policy import RecordingPolicy
from inference.recording.recorder import Recorder
from inference.session.dialogue import DialogueSession, SessionContext, SessionTimeouts
from inference.session.local_handle import LocalHandle
from inference.slots.pool import SlotPool
from inference.slots.worker import EngineWorker

logger = logging.getLogger(__name__)


class InferenceService:
    """Owns one engine and every session on it; lives on one event loop once started.

    Args:
        config: the service configuration.
        engine: an engine instance to serve (default: built from ``config.engine``).
        warmed: the engine was already warmed up (e.g. reused across a restart).
    """

    def __init__(self, config: InferenceConfig, engine: Engine | None = None, *, warmed: bool = False):
        self.config = config
        self.engine = engine if engine is not None else build_engine(config)
        # Clients see the engine's capabilities plus this service's limits (spec: capabilities.max_session_s).
        engine_caps = self.engine.capabilities
        self.capabilities: EngineCapabilities = dataclasses.replace(
            engine_caps,
            extra={**engine_caps.extra, "max_session_s": config.max_session_s, "record_policy": config.record},
        )
        self.recorder: Recorder | None = None  # set by start() unless recording is off
        self.warmed = warmed
        self.loop: asyncio.AbstractEventLoop | None = None
        self.worker: EngineWorker = None  # type: ignore[assignment]  # set by start()
        self.pool: SlotPool[DialogueSession] = None  # type: ignore[assignment]
        self._session_context: SessionContext = None  # type: ignore[assignment]
        self.sessions: dict[str, DialogueSession] = {}  # user_key -> session
        self.started = False

    @property
    def names(self) -> set[str]:
        """Model names a request may ask for."""
        return {self.config.engine, self.capabilities.engine}

    async def start(self, progress: ProgressFn | None = None) -> None:
        """Warm the engine up (in a thread) and start its worker on the running loop."""
        self.loop = asyncio.get_running_loop()
        if not self.warmed:
            await asyncio.to_thread(self.engine.warmup, progress)
            self.warmed = True
        name = f"engine-{self.capabilities.engine}-{self.config.device}"
        self.worker = EngineWorker(self.engine, inbox_frames=self.config.input_queue_frames, name=name)
        self.pool = SlotPool(
            self.worker, queue_max=self.config.queue_max, loop=self.loop, tick_budget=self.config.tick_budget
        )
        if self.config.record != "off":
            self.recorder = Recorder(self.config.recordings_dir)
            self.recorder.start()  # first marks recordings a killed predecessor left open as interrupted
        self._session_context = SessionContext(
            capabilities=self.capabilities,
            loop=self.loop,
            worker=self.worker,
            admission=self.pool,
            timeouts=SessionTimeouts.from_config(self.config),
            forget=self.forget,
            test_output_jitter_ms=self.config.test_output_jitter_ms,
            test_output_jitter_s=self.config.test_output_jitter_s,
            recording=RecordingPolicy(self.config.record, self.recorder, self._recording_meta()),
        )
        self.worker.start()
        self.started = True
        # What start-up made (modules, the model, the web framework in an embedded service) lives as long as
        # the process: frozen out of the collector's reach, a full collection walks only what calls allocate.
        # Unfrozen, a full collection of a web process's ~300 000 start-up objects stalls the loop that carries
        # every caller's frames (bench/notes/serving-e2e.md).
        gc.freeze()

    async def stop(self) -> None:
        """Close every session (reason ``shutdown``) and stop the worker."""
        if not self.started:
            return
        for session in list(self.sessions.values()):
            session.close("shutdown")
        await asyncio.sleep(0)  # let handles see their Closed event before the worker goes
        self.pool.stop()
        await asyncio.to_thread(self.worker.stop)
        self._stop_recorder()
        self.started = False

    def stop_worker(self) -> None:
        """Synchronous stop for when the service's loop is already gone (e.g. a finished test)."""
        if self.started:
            self.worker.stop()
            self._stop_recorder()
            self.started = False

    def _stop_recorder(self) -> None:
        if self.recorder is not None:
            self.recorder.stop()
            self.recorder = None

    def _recording_meta(self) -> dict:
        caps = self.capabilities
        return {
            "engine": caps.engine,
            "family": caps.family,
            "checkpoint": str(self.config.checkpoint) if self.config.checkpoint else None,
            "input_rate": caps.input_rate,
            "input_chunk_samples": caps.input_chunk_samples,
            "output_rate": caps.output_rate,
            "chunk_period_ms": caps.chunk_period_ms,
            # what a replay needs to run the call again on the same configuration (inference/replay)
            "slots": self.config.slots,
            "device": self.config.device,
            "dtype": self.config.dtype,
            "greedy": self.config.greedy,
            "lockstep_backend": self.config.lockstep_backend,
        }

    @property
    def usable_here(self) -> bool:
        """True when the service runs on the current running loop."""
        try:
            return self.started and self.loop is asyncio.get_running_loop() and self.worker.alive
        except RuntimeError:
            return False

    async def open_session(self, request: SessionRequest) -> LocalHandle:
        """Attach to ``request.user_key``'s session: take over, resume, admit or queue."""
        if request.model is not None and request.model not in self.names:
            raise ParleyError(
                f"unknown model {request.model!r}; this service runs {self.capabilities.engine!r}",
                code="model_not_found",
                param="model",
            )
        session = self.sessions.get(request.user_key)
        if session is not None:
            if not session.audio_started and (request.persona is not None or request.voice is not None):
                session.update(persona=request.persona, voice=request.voice)
            handle = LocalHandle(session, self.config.output_queue_frames)
            session.attach(handle, takeover=True)
            return handle
        chat = request.mode == "chat" and "chat" in self.capabilities.modes
        if not chat:
            self.pool.refuse_if_full()  # a refusal builds no session: at the limit refusals come by the dozen
        session = DialogueSession(
            self._session_context, request.user_key, request.persona, request.voice, record=request.record
        )
        handle = LocalHandle(session, self.config.output_queue_frames)
        session.attachment = handle  # Ready or Queued from the pool goes to this handle
        if chat:
            session.admit_for_chat()  # no slot to wait for: each response takes one
        else:
            self.pool.request(session)  # raises resource_exhausted before anything is registered
        self.sessions[request.user_key] = session
        logger.info("session.open", extra={"session_id": session.session_id, "state": session.state})
        return handle

    def forget(self, session: DialogueSession) -> None:
        if self.sessions.get(session.user_key) is session:
            del self.sessions[session.user_key]

    def end_session(self, session_id: str, reason: str = "admin_ended") -> bool:
        for session in self.sessions.values():
            if session.session_id == session_id:
                session.close(reason)  # type: ignore[arg-type]
                return True
        return False

    def occupancy(self) -> list[WorkerSnapshot]:
        now = time.monotonic()
        slots = []
        for i, owner in enumerate(self.pool.owners):
            if owner is None:
                state = "closing" if i in self.pool.closing else "free"
                slots.append(SlotSnapshot(slot=i, state=state))
            else:
                age = now - (owner.admitted_at or now)
                slots.append(SlotSnapshot(i, owner.snapshot_state, owner.session_id, owner.user_key, round(age, 1)))  # type: ignore[arg-type]
        stats = self.worker.stats()
        return [
            WorkerSnapshot(
                engine=self.capabilities.engine,
                device=self.config.device,
                num_slots=self.engine.num_slots,
                slots=tuple(slots),
                queue_length=len(self.pool.queue),
                tick_ms_p50=stats.tick_ms_p50,
                tick_ms_p99=stats.tick_ms_p99,
                recent_tick_ms=stats.recent_tick_ms,
                memory=dict(self.engine.memory_snapshot()),
            )
        ]
