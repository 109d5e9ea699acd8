"""``python -m inference doctor CHECKPOINT``: what a checkpoint is, whether it will load, and what it serves.

Reads config files and safetensors headers only (never the weights), so it runs on any machine in seconds,
before a GPU is booked. Exit status: 0 when the checkpoint is sound, 1 with findings (each naming its file),
2 when the checkpoint cannot be found or fetched.
"""

from __future__ import annotations

import argparse

from inference.checkpoints.capacity import CapacityPlan, GiB, lockstep_plan, unit_plan
from inference.checkpoints.hub import HubError, is_hub_id, resolve_checkpoint
from inference.checkpoints.identify import CheckpointReport, inspect_checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint folder or a hub id (org/name[@revision])")
    parser.add_argument("--gpu-gb", type=float, default=141.0,
                        help="GPU memory in GiB as nvidia-smi shows it / 1024 (default 141: an H200)")  # fmt: skip
    parser.add_argument("--mean-call-s", type=float, default=180.0, help="mean call length of the mix, seconds")
    parser.add_argument("--kv-dtype", choices=("fp8", "bf16"), default="fp8", help="lockstep KV format")
    parser.add_argument("--lockstep-context", type=int, default=0,
                        help="lockstep context in frames below the checkpoint's (PARLEY_LOCKSTEP_CONTEXT)")  # fmt: skip


def plan_for(
    report: CheckpointReport, gpu_gb: float, mean_call_s: float, kv_fp8: bool = True, lockstep_context: int = 0
) -> CapacityPlan | None:
    """The capacity plan for an inspected checkpoint (None when its config could not be read)."""
    if report.lm_config is None:
        return None
    if report.family == "minicpmo":
        return unit_plan(report.lm_config, gpu_gb, weight_bytes=2 * report.parameters, mean_call_s=mean_call_s)
    weights = 2 * report.parameters if report.parameters else None
    return lockstep_plan(
        report.lm_config, gpu_gb, mean_call_s=mean_call_s, kv_fp8=kv_fp8, weight_bytes=weights, context=lockstep_context
    )


def render(name: str, report: CheckpointReport, plan: CapacityPlan | None) -> str:
    lines = [f"checkpoint  {name}" + (f" -> {report.directory}" if str(report.directory) != name else "")]
    lines.append(f"family      {report.family or 'unknown'}")
    if report.sizes:
        lines.append("sizes       " + ", ".join(f"{k} {v}" for k, v in report.sizes.items()))
    if report.parameters:
        dtypes = ", ".join(f"{d} x{n}" for d, n in sorted(report.dtypes.items()))
        lines.append(f"weights     {report.parameters / 1e9:.3f} B parameters; stored as {dtypes}")
    lines.append(f"tokenizer   {report.tokenizer}")
    lines.append(f"codec       {report.codec}")
    lines.append(f"vocoder     {report.vocoder}")
    voices = report.voice_prompts
    lines.append(f"voices      {len(voices)} found" + (f": {', '.join(voices[:6])}" if voices else ""))
    if report.findings:
        lines.append(f"PROBLEMS    {len(report.findings)}")
        lines += [f"  - {finding}" for finding in report.findings[:40]]
        if len(report.findings) > 40:
            lines.append(f"  ... and {len(report.findings) - 40} more")
    else:
        lines.append("layout      every tensor name, shape and dtype matches")
    if plan is not None:
        lines.append(f"capacity    on {plan.gpu_gib:g} GiB: weights {plan.weight_bytes / GiB:.1f} GiB (bf16), "
                     f"{plan.kv_bytes_per_session / 1e6:.0f} MB of KV per full-context session")  # fmt: skip
        lines.append(f"  full context:          {plan.full_context_sessions} sessions")
        if plan.mix_sessions is not None:
            lines.append(f"  call mix (mean {plan.mean_call_s:g} s): {plan.mix_sessions} sessions (paged KV)")
        env = " ".join(f"{k}={v}" for k, v in plan.settings.items())
        lines.append(
            f"serve       PARLEY_ENGINE={report.family} PARLEY_CHECKPOINT={name} {env} python -m inference serve"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    name = str(args.checkpoint)
    try:
        folder = resolve_checkpoint(name)
    except HubError as exc:
        print(f"error: {exc}")
        return 2
    if not is_hub_id(name) and not folder.exists():
        print(f"error: {folder}: no such folder (and not a hub id org/name[@revision])")
        return 2
    report = inspect_checkpoint(folder)
    plan = plan_for(report, args.gpu_gb, args.mean_call_s, args.kv_dtype == "fp8", args.lockstep_context)
    print(render(name, report, plan))
    return 0 if report.ok else 1
