"""The inference service: one engine, its worker thread, the slot pool and every user's session.

In the embedded default ``inference.api`` runs one ``InferenceService`` in the web process. With
``PARLEY_INFERENCE_URL=unix:///path.sock`` the web tier talks to ``python -m inference serve``,
which runs the very same object behind a unix socket (framing in ``inference.wire``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import time

from inference import wire
from inference.client import LocalHandle
from inference.config import InferenceConfig
from inference.contracts import EngineCapabilities, ParleyError, SessionRequest, SlotSnapshot, WorkerSnapshot
from inference.engines import build_engine
from inference.engines.base import Engine, ProgressFn
from inference.errors import WireError
from inference.pool import SlotPool
from inference.session import DialogueSession
from inference.worker import EngineWorker

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
            engine_caps, extra={**engine_caps.extra, "max_session_s": config.max_session_s}
        )
        self.warmed = warmed
        self.loop: asyncio.AbstractEventLoop | None = None
        self.worker: EngineWorker = None  # type: ignore[assignment]  # set by start()
        self.pool: SlotPool = None  # type: ignore[assignment]
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
        self.pool = SlotPool(self.worker, queue_max=self.config.queue_max, loop=self.loop)
        self.worker.start()
        self.started = True

    async def stop(self) -> None:
        """Close every session (reason ``shutdown``) and stop the worker."""
        if not self.started:
            return
        for session in list(self.sessions.values()):
            session.close("shutdown")
        await asyncio.sleep(0)  # let handles see their Closed event before the worker goes
        self.pool.stop()
        await asyncio.to_thread(self.worker.stop)
        self.started = False

    def stop_worker(self) -> None:
        """Synchronous stop for when the service's loop is already gone (e.g. a finished test)."""
        if self.started:
            self.worker.stop()
            self.started = False

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
        session = DialogueSession(self, request.user_key, request.persona, request.voice)
        handle = LocalHandle(session, self.config.output_queue_frames)
        session.attachment = handle  # Ready or Queued from the pool goes to this handle
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


# ---- the socket server --------------------------------------------------------------------------


class Connection:
    """One socket connection: a session handle, or a single one-shot call."""

    def __init__(self, service: InferenceService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.service, self.reader, self.writer = service, reader, writer
        self.handle: LocalHandle | None = None

    async def run(self) -> None:
        try:
            first = await wire.read_frame(self.reader)
            if first is not None and first[0] == wire.JSON:
                await self._first_call(wire.parse_json(first[1]))
        except WireError as exc:
            logger.warning("service.bad_frame", extra={"detail": str(exc)})
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if self.handle is not None:
                await self.handle.detach()  # no-op if the session was closed or taken over
            self.writer.close()
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()

    async def _first_call(self, call: dict) -> None:
        op = call.get("op")
        if op == "capabilities":
            await self._send({"reply": 0, "ok": wire.capabilities_to_dict(self.service.capabilities)})
        elif op == "occupancy":
            snapshots = [wire.snapshot_to_dict(s) for s in self.service.occupancy()]
            await self._send({"reply": 0, "ok": snapshots})
        elif op == "end_session":
            ended = self.service.end_session(str(call.get("session_id")), str(call.get("reason", "admin_ended")))
            await self._send({"reply": 0, "ok": ended})
        elif op == "open":
            try:
                self.handle = await self.service.open_session(wire.request_from_dict(call.get("request")))
            except ParleyError as exc:
                await self._send({"reply": 0, "error": wire.error_to_dict(exc)})
                return
            await self._send({"reply": 0, "ok": True})
            await self._serve_handle(self.handle)
        else:
            await self._send({"reply": 0, "error": {"message": f"unknown op {op!r}", "code": "unknown_event"}})

    async def _serve_handle(self, handle: LocalHandle) -> None:
        pump = asyncio.create_task(self._pump_events(handle))
        try:
            while (item := await wire.read_frame(self.reader)) is not None:
                await self._call(handle, *item)
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    async def _pump_events(self, handle: LocalHandle) -> None:
        with contextlib.suppress(ConnectionError):
            async for event in handle.events():
                self.writer.write(wire.event_frame(event))
                await self.writer.drain()
            await self._send({"event": "end"})

    async def _call(self, handle: LocalHandle, kind: int, payload: bytes) -> None:
        if kind == wire.AUDIO_IN:
            call_id, encoding, rate, data = wire.parse_audio_in(payload)
            await self._reply(call_id, handle.append_audio(data, encoding=encoding, rate=rate))
        elif kind == wire.IMAGE_IN:
            call_id, data = wire.parse_id_frame(payload)
            await self._reply(call_id, handle.append_image(data))
        elif kind == wire.JSON:
            call = wire.parse_json(payload)
            call_id, op, args = call.get("id"), call.get("op"), call.get("args") or {}
            if not isinstance(call_id, int) or not isinstance(args, dict):
                raise WireError("a call needs an integer id and object args")
            await self._reply(call_id, self._dispatch(handle, op, args))
        else:
            raise WireError(f"unexpected frame kind {kind}")

    def _dispatch(self, handle: LocalHandle, op: object, args: dict):
        if op == "update":
            return handle.update(persona=args.get("persona"), voice=wire.voice_from_dict(args.get("voice")))
        if op in ("pause", "resume", "cancel", "force_listen", "detach"):
            return getattr(handle, op)()
        if op == "playback_ack":
            return handle.playback_ack(args.get("played_ms"))
        if op == "close":
            return handle.close(str(args.get("reason", "client_close")))
        raise ParleyError(f"unknown op {op!r}", code="unknown_event")

    async def _reply(self, call_id: int, call) -> None:
        try:
            await call
        except ParleyError as exc:
            await self._send({"reply": call_id, "error": wire.error_to_dict(exc)})
            return
        await self._send({"reply": call_id, "ok": True})

    async def _send(self, obj: dict) -> None:
        self.writer.write(wire.json_frame(obj))
        await self.writer.drain()


async def serve(service: InferenceService, socket_path: str, stop: asyncio.Event) -> None:
    """Accept connections on ``socket_path`` until ``stop`` is set."""
    _remove_stale_socket(socket_path)
    server = await asyncio.start_unix_server(
        lambda r, w: Connection(service, r, w).run(), path=socket_path, limit=wire.MAX_FRAME_BYTES
    )
    os.chmod(socket_path, 0o660)
    print(f"ready: serving {service.capabilities.engine!r} on unix://{socket_path}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        await service.stop()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)


def _remove_stale_socket(path: str) -> None:
    """Remove a socket file left by a dead service; refuse to start next to a live one."""
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        return
    finally:
        probe.close()
    raise SystemExit(f"another inference service is already listening on {path}")


# ---- python -m inference serve ------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", help="unix socket path (default: from PARLEY_INFERENCE_URL, else /tmp)")
    parser.add_argument("--engine", help="engine name (default: PARLEY_ENGINE, else echo)")
    parser.add_argument("--slots", type=int, help="slots (default: PARLEY_SLOTS, else 4)")


def run(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in (("engine", args.engine), ("slots", args.slots)) if v is not None}
    config = InferenceConfig.from_env().with_overrides(**overrides)
    socket_path = args.socket or config.socket_path
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    def progress(fraction: float, stage: str) -> None:
        print(f"warming up {config.engine}: {fraction * 100:5.1f}% {stage}", flush=True)

    async def main() -> None:
        service = InferenceService(config)
        print(f"starting engine {config.engine!r} with {config.slots} slot(s) on {config.device}", flush=True)
        await service.start(progress)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(service, socket_path, stop)

    asyncio.run(main())
    print("stopped", file=sys.stderr, flush=True)
    return 0
