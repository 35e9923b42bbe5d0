"""Why is it (not) faster: eager vs the archive's backend under torch.profiler.

    summary = profile_model(archived, inputs, Path("logs/profile/resnet50-..."))

Both run the same inputs in inference mode; Inductor's C++ kernels are named in the trace
(`cpp.enable_kernel_profile`), and warm-up (compilation included) is kept out of the
recording by the profiler's schedule. Files: <run>_top20.txt (self CPU time), <run>_trace.json
(chrome://tracing or Perfetto), comparison.md (time per operator group, side by side),
tma.txt (top-down level 1 from `perf stat`, or why it is not available), summary.txt.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from handlers.archive import ArchivedModel
from handlers.backends import Backend
from handlers.backends.common import Inputs
from handlers.optimize import OptimizedModel, optimize

WAIT, WARMUP, ACTIVE = 1, 3, 10  # profiler schedule, in steps (one step = one batch)
TIMED_SECONDS = 5.0  # unprofiled loop for the end-to-end latency
TOP = 20

# Operator name -> group, first match wins: what an eager op became after compilation.
OP_GROUPS: tuple[tuple[str, re.Pattern], ...] = tuple(
    (group, re.compile(pattern))
    for group, pattern in (
        ("convolution", r"conv"),
        ("matmul / linear", r"addmm|::mm$|bmm|linear|matmul|mkl_linear"),
        ("attention", r"scaled_dot_product|softmax"),
        ("Inductor generated C++", r"^cpp_fused|^kernel_cpp|^cpp_"),
        ("normalization", r"norm"),
        ("elementwise / other aten", r"^aten::"),
        ("framework", r".*"),
    )
)


@dataclasses.dataclass(frozen=True)
class OpTime:
    name: str
    self_ms_per_step: float
    calls_per_step: float


@dataclasses.dataclass(frozen=True)
class RunProfile:
    label: str
    backend: str
    latency_ms: float  # unprofiled, per batch
    ops: list[OpTime]  # by self CPU time, descending

    def groups(self) -> dict[str, float]:
        totals = {group: 0.0 for group, _ in OP_GROUPS}
        for op in self.ops:
            group = next(g for g, pattern in OP_GROUPS if pattern.search(op.name))
            totals[group] += op.self_ms_per_step
        return totals


def timed_latency_ms(run: Callable, inputs: Inputs, seconds: float = TIMED_SECONDS) -> float:
    calls = 0
    with torch.inference_mode():
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            run(*inputs)
            calls += 1
    return (time.perf_counter() - start) / calls * 1000


def record(label: str, optimized: OptimizedModel, inputs: Inputs, out_dir: Path) -> RunProfile:
    plan = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan) as prof, torch.inference_mode():
        for _ in range(WAIT + WARMUP + ACTIVE):
            optimized(*inputs)
            prof.step()
    averages = prof.key_averages()
    (out_dir / f"{label}_top{TOP}.txt").write_text(averages.table(sort_by="self_cpu_time_total", row_limit=TOP))
    prof.export_chrome_trace(str(out_dir / f"{label}_trace.json"))
    ops = sorted(
        (OpTime(e.key, e.self_cpu_time_total / 1000 / ACTIVE, e.count / ACTIVE) for e in averages),
        key=lambda op: op.self_ms_per_step,
        reverse=True,
    )
    return RunProfile(label, optimized.backend.value, timed_latency_ms(optimized, inputs), ops)


def comparison(eager: RunProfile, compiled: RunProfile) -> str:
    lines = [
        f"# {eager.label} vs {compiled.label}: self CPU ms per batch, by operator group",
        "",
        f"| group | {eager.label} | {compiled.label} |",
        "|---|---|---|",
    ]
    eager_groups, compiled_groups = eager.groups(), compiled.groups()
    for group, _ in OP_GROUPS:
        if eager_groups[group] or compiled_groups[group]:
            lines.append(f"| {group} | {eager_groups[group]:.2f} | {compiled_groups[group]:.2f} |")
    lines += ["", f"| # | {eager.label} op | ms | {compiled.label} op / kernel | ms |", "|---|---|---|---|---|"]
    for rank in range(10):
        left = eager.ops[rank] if rank < len(eager.ops) else None
        right = compiled.ops[rank] if rank < len(compiled.ops) else None
        lines.append(
            f"| {rank + 1} | {left.name if left else ''} | {left.self_ms_per_step if left else 0:.2f} | "
            f"{right.name if right else ''} | {right.self_ms_per_step if right else 0:.2f} |"
        )
    return "\n".join(lines) + "\n"


def topdown(run: Callable, inputs: Inputs, out_dir: Path) -> str:
    """Top-down level 1 of this process over an unprofiled loop, or why it cannot be had."""
    probe = subprocess.run(["perf", "stat", "-x,", "-e", "cycles", "--", "true"], capture_output=True, text=True)
    if probe.returncode != 0 or "<not supported>" in probe.stderr:
        reason = (
            "perf is not installed" if probe.returncode == 127 else "the CPU's PMU is not exposed here (VM/container)"
        )
        return f"top-down (TMA) not available: {reason}; `perf stat -e cycles` says: {probe.stderr.strip()[:200]}"
    output = out_dir / "tma_raw.txt"
    perf = subprocess.Popen(["perf", "stat", "-M", "TopdownL1", "-x,", "-o", str(output), "-p", str(os.getpid())])
    try:
        timed_latency_ms(run, inputs)
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(30)
    metrics = [line for line in output.read_text().splitlines() if re.search(r"tma_|retiring|bound|speculation", line)]
    return "\n".join(metrics) or f"perf stat gave no TopdownL1 metrics; see {output}"


def profile_model(archived: ArchivedModel, inputs: Inputs, out_dir: Path) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    eager_settings = dataclasses.replace(archived.settings, backend=Backend.EAGER)
    runs = {"eager": optimize(archived.model, eager_settings, [inputs])}
    # Named C++ kernels in the trace; set before compiling, as it changes the generated code.
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        checks = archived.handler.samples.checks(inputs[0].shape[0])  # realistic inputs: int8's guard needs them
        runs[archived.settings.backend.value] = optimize(
            archived.model, archived.settings, [inputs], archived.model_dir, checks
        )
    profiles = [record(label, optimized, inputs, out_dir) for label, optimized in runs.items()]
    eager, compiled = profiles[0], profiles[-1]
    (out_dir / "comparison.md").write_text(comparison(eager, compiled))
    tma = "\n".join(f"{p.label}: {topdown(runs[p.label], inputs, out_dir)}" for p in profiles)
    (out_dir / "tma.txt").write_text(tma + "\n")
    batch = inputs[0].shape[0]
    top = ", ".join(f"{g} {ms:.1f} ms" for g, ms in sorted(compiled.groups().items(), key=lambda kv: -kv[1])[:3])
    summary = (
        f"{archived.name} batch {batch}, {torch.get_num_threads()} thread(s): eager {eager.latency_ms:.1f} ms, "
        f"{compiled.label} {compiled.latency_ms:.1f} ms per batch ({eager.latency_ms / compiled.latency_ms:.2f}x). "
        f"Where {compiled.label} spends its time: {top}. Eager's top operator: {eager.ops[0].name} "
        f"({eager.ops[0].self_ms_per_step:.1f} ms); {compiled.label}'s: {compiled.ops[0].name} "
        f"({compiled.ops[0].self_ms_per_step:.1f} ms). Side by side: comparison.md; traces: *_trace.json."
        f"\n{tma}"
    )
    (out_dir / "summary.txt").write_text(summary + "\n")
    return summary
