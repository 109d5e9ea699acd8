"""Voice clips prepared in a child process under memory, CPU-time and wall-clock limits.

``prepare_clip`` decodes untrusted audio. The header probe (``media_probe``) refuses what a header declares, but
a container can still lie or a codec allocate on its own, and the Celery task that decodes clips runs inside the
web process whenever Celery is eager (tests, the embedded default). So the work runs in a fresh
``python -m inference.clip_sandbox``, which caps its own address space and CPU time with ``setrlimit`` before it
reads a byte: whatever a clip does, it does to that child, which the limits stop. The caller gets the child's
``VoiceClipError`` as it was raised, or ``too_demanding`` when a limit stopped it, and its own memory never holds
more than the finished 24 kHz clip.

The child reports on stdout, one JSON object a line: ``{"progress": [stage, fraction]}``, then
``{"prepared": {...}}`` (the wav is in the output file) or ``{"refused": {"code", "message"}}``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from inference.contracts import ParleyError
from inference.media_probe import VoiceClipError

logger = logging.getLogger(__name__)

_ROOT = Path(__file__).resolve().parents[1]  # the child imports this very copy of ``inference``


@dataclass(frozen=True)
class SandboxLimits:
    """What one clip's preparation may take. Python, numpy, scipy, soxr and FFmpeg map ~0.5 GB of address
    space before the first sample; a 5-minute 96 kHz clip needs well under another gigabyte."""

    memory_bytes: int = 2 * 1024**3
    cpu_s: int = 60
    wall_s: float = 120.0


def prepare_clip_in_child(data: bytes, *, progress=None, min_speech_s: float, limits: SandboxLimits = SandboxLimits()):
    """``voice_prompts.prepare_clip`` run in a limited child process; returns its ``PreparedClip``.

    Raises:
        VoiceClipError: the child's refusal, or ``too_demanding`` when a limit stopped it.
        ParleyError: ``internal_error`` when the child failed for another reason (logged with its stderr).
    """
    with tempfile.TemporaryDirectory(prefix="parley-clip-") as folder:
        source, prepared, errors = Path(folder) / "input", Path(folder) / "prepared.wav", Path(folder) / "stderr"
        source.write_bytes(data)
        options = {"min_speech_s": min_speech_s, "memory_bytes": limits.memory_bytes, "cpu_s": limits.cpu_s}
        command = [sys.executable, "-m", "inference.clip_sandbox", str(source), str(prepared), json.dumps(options)]
        with errors.open("wb") as stderr:
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                     env=_child_env(), cwd=folder)  # fmt: skip
            try:
                outcome = _follow(child, progress, deadline=time.monotonic() + limits.wall_s)
            finally:
                if child.poll() is None:
                    child.kill()
                child.wait()
                child.stdout.close()
        if outcome is None:
            raise _stopped(child.returncode, limits, errors.read_text(errors="replace")[-2000:])
        if "refused" in outcome:
            raise VoiceClipError(outcome["refused"]["message"], code=outcome["refused"]["code"])
        return _read_prepared(prepared.read_bytes(), outcome["prepared"])


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"  # one clip, one core; thread pools would also reserve address space
    return env


def _follow(child: subprocess.Popen, progress, *, deadline: float) -> dict | None:
    """Read the child's report lines until it ends; its outcome, or None if it ended (or ran out of time)
    without one."""
    buffer = b""
    fd = child.stdout.fileno()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue  # something a library printed: only our own lines are JSON objects
            if not isinstance(message, dict):
                continue
            if "progress" in message:
                if progress is not None:
                    progress(*message["progress"])
            else:
                return message


def _stopped(returncode: int | None, limits: SandboxLimits, stderr: str) -> ParleyError:
    memory_mb = limits.memory_bytes // (1024 * 1024)
    if returncode is None or returncode == -signal.SIGKILL:  # our kill at the wall-clock limit, or the OOM killer
        reason = f"it took longer than {limits.wall_s:g} s"
    elif returncode in (-signal.SIGXCPU, -signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS):
        # past the CPU limit, or a native allocation failing against the memory limit
        reason = f"it needed more than {limits.cpu_s} s of processor time or {memory_mb} MB of memory"
    else:
        logger.error("voices.sandbox_failed", extra={"returncode": returncode, "stderr": stderr})
        return ParleyError("Decoding the clip failed unexpectedly; please try again.", code="internal_error")
    return VoiceClipError(f"Decoding the clip was stopped: {reason}. Upload a shorter, ordinary recording.",
                          code="too_demanding")  # fmt: skip


def _read_prepared(wav: bytes, facts: dict):
    import soundfile

    from inference.voice_prompts import PreparedClip

    pcm, _ = soundfile.read(io.BytesIO(wav), dtype="float32")
    return PreparedClip(pcm=pcm, wav=wav, source_s=facts["source_s"], speech_s=facts["speech_s"])


# ---- the child ----------------------------------------------------------------------------------------------


def _emit(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _child(source: str, target: str, options: str) -> int:
    import resource

    settings = json.loads(options)
    memory, cpu = int(settings["memory_bytes"]), int(settings["cpu_s"])
    # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL 5 s later. A kernel that refuses a limit (macOS and
    # RLIMIT_AS) leaves the child without it, never without the parent's wall-clock kill.
    for limit, value in ((resource.RLIMIT_AS, (memory, memory)), (resource.RLIMIT_CPU, (cpu, cpu + 5))):
        try:
            resource.setrlimit(limit, value)
        except (ValueError, OSError) as exc:
            print(f"clip_sandbox: limit {limit} not set: {exc}", file=sys.stderr)

    from inference.voice_prompts import prepare_clip

    last: tuple[str, int] | None = None

    def report(stage: str, fraction: float) -> None:
        nonlocal last
        if (stage, int(fraction * 100)) != last:  # whole percents: the caller's page shows no finer steps
            last = (stage, int(fraction * 100))
            _emit({"progress": [stage, fraction]})

    try:
        clip = prepare_clip(Path(source).read_bytes(), progress=report, min_speech_s=settings["min_speech_s"])
    except VoiceClipError as exc:
        _emit({"refused": {"code": exc.code, "message": exc.message}})
        return 0
    except MemoryError:
        memory_mb = memory // (1024 * 1024)
        message = f"Decoding the clip was stopped: it needed more than {memory_mb} MB of memory."
        _emit({"refused": {"code": "too_demanding", "message": message + " Upload a shorter, ordinary recording."}})
        return 0
    Path(target).write_bytes(clip.wav)
    _emit({"prepared": {"source_s": clip.source_s, "speech_s": clip.speech_s}})
    return 0


if __name__ == "__main__":
    sys.exit(_child(*sys.argv[1:4]))
