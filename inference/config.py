"""Inference-side configuration: the only place in ``inference/`` that reads ``os.environ``."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

_VAR = Path(__file__).resolve().parent.parent / "var"
# In a private directory (0700, checked at start), never in world-writable /tmp where anyone could squat it.
DEFAULT_SOCKET_PATH = str(_VAR / "run" / "inference.sock")
# Where the web tier stores voice files (var/media, and its local copies of remote ones).
DEFAULT_VOICE_ROOTS = (_VAR / "media" / "voices", _VAR / "media" / "voice-prompts", _VAR / "cache" / "voices")


# The unit engine's smallest context: its window then slides back to 896 positions (28 s of an audio-only call
# at least: an audio unit takes at most 32), of which a system prompt with a voice clip takes a few hundred.
MIN_UNIT_CONTEXT = 2048
# The lockstep engine's smallest context: 10 s of call. A session whose voice prompt and persona do not fit the
# context is refused when it opens (``LockstepEngine.open_slot``), so this only keeps a setting from being absurd.
MIN_LOCKSTEP_CONTEXT = 125


class ConfigError(ValueError):
    """An environment variable or override has a value the service cannot use."""


@dataclass(frozen=True)
class InferenceConfig:
    """Everything the inference service needs to start; frozen once built.

    Attributes:
        engine: engine name for the registry (``echo``, ``moshi``, ``personaplex``, ``minicpmo`` ...); ``auto``
            (what ``PARLEY_ENGINE`` unset with ``PARLEY_CHECKPOINT`` set gives) is the checkpoint's family.
        checkpoint: checkpoint directory, or a hub id ``org/name[@revision]`` (resolved with huggingface_hub,
            ``HubAccess``), for model engines (None for echo).
        slots: sessions served at once per engine (batch size of a lockstep engine).
        queue_max: how many users may wait for a slot; 0 disables queueing.
        disconnect_grace_s: a dropped socket keeps its session paused this long.
        pause_timeout_s: a session paused by its user closes after this long.
        idle_timeout_s: a session with no client activity closes after this long.
        max_session_s: hard limit on a session's duration.
        device: torch device string for model engines.
        dtype: torch dtype name for model engines.
        lockstep_backend: lockstep engines' stepper: ``auto`` (the fast path: CUDA graphs + Triton on a GPU,
            its torch twins on CPU) or ``eager`` (the plain reference-shaped step).
        kv_dtype: the fast path's KV cache format: ``fp8`` (e4m3 + one fp32 scale per vector: half the memory
            of bf16), ``bf16`` (the model's own dtype) or ``auto`` (fp8 for a bfloat16 model on CUDA, the
            model's dtype otherwise); ``bench/notes/lockstep-kv-format.md`` has the measured trade-off.
        kv_page_frames: the fast path's KV page, in frames; 0 gives each session its whole context up front.
            With pages, a session holds KV only for the context it has reached, so short calls leave room
            for more sessions than full contexts would fit (``inference/models/moshi/fast/pages.py``).
        kv_pool_gb: device memory for the paged KV pool; 0 = every slot's full context (never overcommitted).
        kv_mean_call_s: the call length admission plans for when the pool is smaller than every slot's full
            context: a session is admitted while the pages calls are expected to hold over their remaining
            life fit (otherwise it waits in the queue); ``PagePool.admissible``.
        tick_budget: admission's third limit, a fraction of the engine's period: while the 90th percentile of
            the last 2 s of ticks takes longer than this, new sessions wait in the queue (the engine is at its
            compute capacity: one more would make every live call late). 0 turns the limit off. 0.8, not closer
            to 1: a call admitted now costs more as its context grows, and nothing sheds a live call, so the
            budget keeps room for that growth and for the ticks' tail (at 0.9, eight minutes at 183 lockstep
            callers on an H200 crept to p50 73.6 ms, p99 144 ms, and lost 30 388 live frames).
        unit_context: the unit engine's LLM positions per session (MiniCPM-o). Past them the oldest units after
            the prompt slide out (about 4 minutes of an audio-only call at the default, the reference demo's 8192
            tokens; capped by the checkpoint's own limit). The engine's tick grows with its calls' contexts, so a
            shorter one holds more aged calls on a GPU at the price of what the model remembers of the call; the
            engine reports what it keeps (``memory_s`` in its capabilities).
        lockstep_context: the lockstep engine's context in 80 ms frames (Moshi, PersonaPlex); 0 = the
            checkpoint's own (3000: 4 minutes). Past it the oldest frames slide out of the KV ring, the system
            prompt first, as they do past the checkpoint's context. Each tick reads every live call's context,
            so a shorter one holds more aged calls per GPU and pages fewer bytes, at the price of what the model
            remembers of the call; the engine reports it (``context_s`` in its capabilities).
        inference_url: None = in-process service; ``unix:///path.sock`` or ``tcp://host:port`` = one remote service.
        registry_url: Redis URL of the service registry: services heartbeat there and the web tier places
            sessions on the least loaded one (takes precedence over ``inference_url`` in the web tier).
        service_id: this service's name in the registry (default: hostname-pid).
        heartbeat_s: how often a service publishes its status to the registry.
        heartbeat_timeout_s: a service silent for longer is marked down and its callers get engine_failed.
        echo_delay_frames: echo engine: frames between an input frame and its echo.
        echo_prefill_ticks: echo engine: ticks of simulated prefill after a slot opens.
        test_echo_slow_tick_ms: test-only: the echo engine's tick takes at least this long (0 = as fast as it
            can), to show an engine that cannot keep up: late ticks, queued and dropped frames, and the
            caller told "the server is behind".
        test_echo_slot_cost_ms: test-only: each tick takes this much longer per open slot, as a GPU's tick grows
            with its calls, so time admission's limit can be reached on any machine.
        test_echo_slow_for_s: test-only: ... for the first N seconds after a slot opens (0 = always), so the
            same call also shows the recovery.
        input_queue_frames: bounded per-session inbox (engine chunks); overflow drops the oldest.
        output_queue_frames: bounded per-attachment outbound audio queue; overflow drops the oldest.
        test_output_jitter_ms: test-only: hold each tick's output back a random 0..N ms (order kept), to
            show bad networks degrade a call without breaking it (``bench/latency_browser.py``).
        test_output_jitter_s: test-only: ... during each session's first N seconds of output (0 = always).
        greedy: lockstep engines decode by argmax instead of the checkpoint's sampling (a replay of a call on
            the same configuration then gives the same tokens; ``inference/replay``).
        record: deployment recording policy: ``auto`` (recorded unless the session asks not to be),
            ``on`` (always, whatever the session asks) or ``off`` (never).
        log_json: the service logs JSON lines (production), with every ``extra={...}`` field as a key;
            otherwise a readable console line with ``key=value`` extras (``inference/log_format.py``).
        recordings_dir: where raw recordings are written (one folder per session); the web tier's
            post-processing reads the same folder, so both processes must see the same path.
    """

    engine: str = "echo"
    checkpoint: Path | None = None
    slots: int = 4
    queue_max: int = 8
    disconnect_grace_s: float = 30.0
    pause_timeout_s: float = 60.0
    idle_timeout_s: float = 300.0
    max_session_s: float = 3600.0
    device: str = "cpu"
    dtype: str = "float32"
    lockstep_backend: str = "auto"
    kv_dtype: str = "auto"
    kv_page_frames: int = 0
    kv_pool_gb: float = 0.0
    kv_mean_call_s: float = 180.0
    tick_budget: float = 0.8
    unit_context: int = 8192
    lockstep_context: int = 0
    inference_url: str | None = None
    registry_url: str | None = None
    service_id: str | None = None
    heartbeat_s: float = 0.5
    heartbeat_timeout_s: float = 3.0
    echo_delay_frames: int = 3
    echo_prefill_ticks: int = 0
    test_echo_slow_tick_ms: float = 0.0
    test_echo_slow_for_s: float = 0.0
    test_echo_slot_cost_ms: float = 0.0
    input_queue_frames: int = 16
    output_queue_frames: int = 64
    test_output_jitter_ms: float = 0.0
    test_output_jitter_s: float = 0.0
    # Every connection to the service must present it (inference/transport/auth.py); never printed.
    inference_token: str | None = dataclasses.field(default=None, repr=False)
    voices_dirs: str = ""  # os.pathsep-separated roots a voice file must be in; "" = DEFAULT_VOICE_ROOTS
    greedy: bool = False
    record: str = "auto"
    log_json: bool = False
    recordings_dir: Path = Path(__file__).resolve().parent.parent / "var" / "recordings" / "raw"

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ConfigError(f"slots must be >= 1, got {self.slots}")
        if not 0.0 <= self.tick_budget <= 1.0:
            raise ConfigError(
                f"tick_budget must be in [0, 1] (a fraction of the engine's period), got {self.tick_budget}"
            )
        if self.unit_context < MIN_UNIT_CONTEXT:
            raise ConfigError(
                f"unit_context must be >= {MIN_UNIT_CONTEXT} (the prompt and half a minute of units), got {self.unit_context}"
            )
        if self.lockstep_context and self.lockstep_context < MIN_LOCKSTEP_CONTEXT:
            raise ConfigError(
                f"lockstep_context must be 0 (the checkpoint's) or >= {MIN_LOCKSTEP_CONTEXT} frames (10 s), "
                f"got {self.lockstep_context}"
            )
        if self.queue_max < 0:
            raise ConfigError(f"queue_max must be >= 0, got {self.queue_max}")
        for name in ("disconnect_grace_s", "pause_timeout_s", "idle_timeout_s", "max_session_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.echo_delay_frames < 0 or self.echo_prefill_ticks < 0:
            raise ConfigError("echo_delay_frames and echo_prefill_ticks must be >= 0")
        if self.test_echo_slow_tick_ms < 0 or self.test_echo_slow_for_s < 0 or self.test_echo_slot_cost_ms < 0:
            raise ConfigError("test_echo_slow_tick_ms, test_echo_slow_for_s and test_echo_slot_cost_ms must be >= 0")
        if self.test_output_jitter_ms < 0 or self.test_output_jitter_s < 0:
            raise ConfigError("test_output_jitter_ms and test_output_jitter_s must be >= 0")
        if self.input_queue_frames < 1 or self.output_queue_frames < 1:
            raise ConfigError("input_queue_frames and output_queue_frames must be >= 1")
        if self.lockstep_backend not in ("auto", "eager", "fast"):
            raise ConfigError(f"PARLEY_LOCKSTEP_BACKEND must be auto, eager or fast, got {self.lockstep_backend!r}")
        if self.kv_dtype not in ("auto", "fp8", "bf16"):
            raise ConfigError(f"PARLEY_KV_DTYPE must be auto, fp8 or bf16, got {self.kv_dtype!r}")
        if self.kv_page_frames < 0 or self.kv_page_frames % 16 or self.kv_pool_gb < 0 or self.kv_mean_call_s <= 0:
            # attention reads a page in blocks of 16-128 frames that must not span two pages
            raise ConfigError(
                "kv_page_frames must be 0 (contiguous) or a multiple of 16, kv_pool_gb >= 0 and kv_mean_call_s > 0"
            )
        if self.inference_url is not None and not self.inference_url.startswith(("unix://", "tcp://")):
            raise ConfigError(
                f"PARLEY_INFERENCE_URL must be unix:///path/to.sock or tcp://host:port, got {self.inference_url!r}"
            )
        if self.record not in ("auto", "on", "off"):
            raise ConfigError(f"PARLEY_RECORD must be auto, on or off, got {self.record!r}")
        if self.heartbeat_s <= 0 or self.heartbeat_timeout_s <= self.heartbeat_s:
            raise ConfigError("heartbeat_s must be > 0 and heartbeat_timeout_s larger than heartbeat_s")

    @property
    def socket_path(self) -> str:
        """The unix socket path of the remote service (the default path when none is configured)."""
        if self.inference_url:
            return self.inference_url.removeprefix("unix://")
        return DEFAULT_SOCKET_PATH

    @property
    def voice_roots(self) -> tuple[Path, ...]:
        """The only directories the service reads voice files from (inference/voice_files.py)."""
        if self.voices_dirs:
            return tuple(Path(part) for part in self.voices_dirs.split(os.pathsep) if part)
        return DEFAULT_VOICE_ROOTS

    def with_overrides(self, **overrides: Any) -> InferenceConfig:
        """A copy with some fields replaced; unknown names raise ConfigError."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"unknown inference config field(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> InferenceConfig:
        """Build from ``PARLEY_*`` variables; unset or empty ones keep their defaults.

        Each value is parsed by pydantic as its field's type (``PARLEY_SLOTS=four`` or a boolean ``ture`` is an
        error, never a silent default), and every bad variable is named with its value in one ``ConfigError``;
        the bounds in ``__post_init__`` then name the variable too.
        """
        env = os.environ if environ is None else environ
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        errors: list[str] = []
        for field in dataclasses.fields(cls):
            var = "PARLEY_" + field.name.upper()
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[field.name] = TypeAdapter(hints[field.name]).validate_python(raw.strip())
            except ValidationError as exc:
                errors.append(f"{var}={_shown(field, raw)}: {exc.errors()[0]['msg']}")
        if errors:
            raise ConfigError("; ".join(errors))
        if "engine" not in values and "checkpoint" in values:
            values["engine"] = "auto"  # the checkpoint's family (inference/checkpoints/resolve.py)
        try:
            return cls(**values)
        except ConfigError as exc:
            named = [f"PARLEY_{name.upper()}={_shown(f, env.get('PARLEY_' + name.upper()))}" for f in
                     dataclasses.fields(cls) if (name := f.name) in values and name in str(exc).lower()]  # fmt: skip
            raise ConfigError(f"{exc} ({', '.join(named)})" if named else str(exc)) from None


def _shown(field: dataclasses.Field, raw: str | None) -> str:
    """A variable's value for an error message; secrets (fields kept out of repr) are not shown."""
    return repr(raw) if field.repr else "<hidden>"


@dataclass(frozen=True)
class HubAccess:
    """How hub repository ids are fetched (``inference/checkpoints/hub.py``), from huggingface_hub's own variables.

    Attributes:
        token: ``HF_TOKEN`` for gated repositories (PersonaPlex); never printed.
        offline: ``HF_HUB_OFFLINE`` set to a true value: resolve from the cache only, never the network.
        cache_dir: ``HF_HUB_CACHE`` (else ``$HF_HOME/hub``); None = huggingface_hub's default.
        endpoint: ``HF_ENDPOINT``, a hub mirror; None = huggingface.co.
    """

    token: str | None = dataclasses.field(default=None, repr=False)
    offline: bool = False
    cache_dir: Path | None = None
    endpoint: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HubAccess:
        env = os.environ if environ is None else environ
        cache = env.get("HF_HUB_CACHE") or (str(Path(env["HF_HOME"]) / "hub") if env.get("HF_HOME") else None)
        return cls(
            token=env.get("HF_TOKEN") or None,
            offline=env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"),
            cache_dir=Path(cache) if cache else None,
            endpoint=env.get("HF_ENDPOINT") or None,
        )
