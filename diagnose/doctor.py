"""Which compiler stage breaks a model, or changes its numbers: `make doctor MODEL=resnet50`.

    .venv/bin/python -m diagnose doctor --model resnet50 [--variant inductor] [--debug-dump]

Runs the archive's model eager as the reference, then torch.compile with backend "eager"
(Dynamo alone), "aot_eager" (+ AOT Autograd) and "inductor" (+ code generation, with the
archive's own options) in turn. The first stage that raises, or whose output differs from
the reference beyond the model's tolerance, is the culprit. When it is Inductor, the
minifier (TORCHDYNAMO_REPRO_AFTER=aot; repro level 4 for accuracy) shrinks the graph to a
standalone repro.py. `--debug-dump` keeps TORCH_COMPILE_DEBUG's files (FX graph, IR before
and after fusion, output_code.py). Everything lands in logs/doctor/<model>-<time>/.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from handlers.accuracy import ERROR_METRICS, Answer, tolerance
from handlers.backends import inductor
from handlers.backends.common import BuildSpec, Inputs, prepare, short_reason, to_layout
from handlers.settings import OptimizationSettings
from kit.paths import ROOT

MINIFIER_DEADLINE_S = 1800


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str  # the component this stage adds
    backend: str  # torch.compile backend that stops right after it


STAGES = (Stage("Dynamo", "eager"), Stage("AOT Autograd", "aot_eager"), Stage("Inductor", "inductor"))


@dataclasses.dataclass(frozen=True)
class StageResult:
    stage: str
    backend: str
    passed: bool
    error: str  # shortened exception, "" if it ran
    accuracy_error: float | None  # the worst output row's relative error; None if it did not run
    seconds: float


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    model: str
    tolerance: float
    metric: str  # handlers/accuracy.ERROR_METRICS: the raw output's, where a compiler's error shows
    stages: list[StageResult]
    culprit: str | None  # first failing stage, None if all pass
    repro: str | None = None  # minified repro script
    debug_dir: str | None = None  # TORCH_COMPILE_DEBUG dump

    def summary(self) -> str:
        lines = [f"{self.model}: eager reference, tolerance {self.tolerance:.3g} ({self.metric})"]
        for r in self.stages:
            measured = "not run" if r.accuracy_error is None else f"error {r.accuracy_error:.3g}"
            verdict = "ok" if r.passed else "FAILED"
            lines.append(
                f"  {r.stage:13} backend={r.backend:10} {verdict:6} {measured:16} {r.seconds:6.1f}s  {r.error}"
            )
        lines.append(f"culprit: {self.culprit}" if self.culprit else "every stage matches eager")
        if self.repro:
            lines.append(f"minified repro: {self.repro}  (run it: python {self.repro})")
        if self.debug_dir:
            lines.append(f"TORCH_COMPILE_DEBUG dump: {self.debug_dir}  (see output_code.py, ir_post_fusion.txt)")
        return "\n".join(lines)


def compile_inductor(prepared: nn.Module, settings: OptimizationSettings, inputs: Inputs) -> Callable:
    """The served Inductor build: the archive's options, freezing."""
    return inductor.build(prepared, settings, BuildSpec(inputs, (inputs[0].shape[0],)))


def stage_runner(stage: Stage, prepared: nn.Module, settings: OptimizationSettings, inputs: Inputs) -> Callable:
    if stage.backend == "inductor":
        return compile_inductor(prepared, settings, inputs)
    return torch.compile(prepared, backend=stage.backend, dynamic=False)


def run_stage(stage: Stage, prepared: nn.Module, inputs: Inputs, reference: torch.Tensor, settings) -> StageResult:
    torch._dynamo.reset()
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            output = stage_runner(stage, prepared, settings, inputs)(*inputs)
    except Exception as error:  # noqa: BLE001 - any failure is the finding
        return StageResult(
            stage.name, stage.backend, False, short_reason(error)[:300], None, time.perf_counter() - start
        )
    # The raw output (Answer.VALUES), whatever the task answers: a stage that bends it is the culprit.
    error = ERROR_METRICS[Answer.VALUES].measure(output, reference).max().item()
    passed = error <= tolerance(settings, Answer.VALUES)
    return StageResult(stage.name, stage.backend, passed, "", error, time.perf_counter() - start)


def minify(prepared: nn.Module, inputs: Inputs, settings, out_dir: Path, accuracy: bool, progress) -> Path | None:
    """Dump the failing AOT graph with the minifier on, run its launcher, keep the repro."""
    work = out_dir / "minifier"
    torch._dynamo.reset()
    patch = {"repro_after": "aot", "repro_level": 4 if accuracy else 2, "debug_dir_root": str(work)}
    # The dump also copies repro.py into the working directory: keep it inside out_dir.
    with torch._dynamo.config.patch(patch), contextlib.chdir(out_dir):
        try:
            with torch.inference_mode():
                compile_inductor(prepared, settings, inputs)(*inputs)
        except Exception:  # noqa: BLE001, S110 - expected: the failure is what gets dumped
            pass
    launchers = sorted(work.rglob("minifier_launcher.py"), key=lambda p: p.stat().st_mtime)
    if not launchers:
        progress("[doctor] the minifier wrote no launcher: the failure did not reproduce on the AOT graph")
        return None
    progress(f"[doctor] minifying {launchers[-1]} (can take minutes)")
    repro = run_minifier(launchers[-1], out_dir / "minifier.log", progress)
    if repro is None:
        progress(f"[doctor] the minifier produced no repro.py; see {out_dir / 'minifier.log'}")
        return None
    return Path(shutil.copy(repro, out_dir / "repro.py"))


# In the launcher's process first: its default starts a Python that imports torch for every
# candidate graph it tries. The doctor's own test case (tests/integration: a wrong C++ relu), the
# same launcher run both ways in 3 interleaved rounds: the same repro in 6.1 s (6.1-6.4) against
# 64.6 s (63.3-77.5), 2-core AMD EPYC. A candidate whose compile crashes that process leaves no
# repro.py (the minifier writes it at its end): then each candidate in a process of its own, the
# launcher's default.
ISOLATION = ("--no-isolate", "--isolate")


def run_minifier(launcher: Path, log: Path, progress) -> Path | None:
    """The minifier's repro.py (beside its launcher), or None; what each attempt printed, in `log`."""
    printed = ""
    for isolation in ISOLATION:
        completed = subprocess.run(
            [sys.executable, str(launcher), "minify", isolation],
            cwd=launcher.parent,
            capture_output=True,
            text=True,
            timeout=MINIFIER_DEADLINE_S,
        )
        printed += f"$ python {launcher.name} minify {isolation}\n{completed.stdout}{completed.stderr}"
        log.write_text(printed)
        if (repro := launcher.parent / "repro.py").is_file():
            return repro
        progress(f"[doctor] minify {isolation} left no repro.py (exit {completed.returncode})")
    return None


def debug_dump(model_dir: Path, out_dir: Path) -> Path:
    """TORCH_COMPILE_DEBUG needs a fresh process (read at import): compile the archive there."""
    target = out_dir / "compile_debug"
    env = {**os.environ, "TORCH_COMPILE_DEBUG": "1", "TORCH_COMPILE_DEBUG_DIR": str(target)}
    code = (
        "import sys; from pathlib import Path; from handlers.archive import load_archived; "
        "from handlers.optimize import optimize; a = load_archived(Path(sys.argv[1])); "
        "optimize(a.model, a.settings, [a.example(1)])"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code, str(model_dir)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    (out_dir / "compile_debug.log").write_text(completed.stdout + completed.stderr)
    if completed.returncode != 0:
        raise RuntimeError(f"the TORCH_COMPILE_DEBUG compile failed; see {out_dir / 'compile_debug.log'}")
    return target


def diagnose(
    name: str,
    model: nn.Module,
    inputs: Inputs,
    settings: OptimizationSettings,
    out_dir: Path,
    minify_on_failure: bool = True,
    progress: Callable[[str], None] = print,
) -> Diagnosis:
    out_dir.mkdir(parents=True, exist_ok=True)
    prepared = prepare(model, settings)
    inputs = to_layout(inputs, settings.channels_last)
    with torch.inference_mode():
        reference = prepared(*inputs)
    results = []
    for stage in STAGES:
        progress(f"[doctor] {name}: torch.compile(backend={stage.backend!r}) ...")
        results.append(run_stage(stage, prepared, inputs, reference, settings))
        if not results[-1].passed:
            break  # later stages include this one's component: they would only repeat it
    culprit = next((r for r in results if not r.passed), None)
    metric = ERROR_METRICS[Answer.VALUES].formula
    limit = tolerance(settings, Answer.VALUES)
    diagnosis = Diagnosis(name, limit, metric, results, culprit.stage if culprit else None)
    if culprit and culprit.stage == "Inductor" and minify_on_failure:
        repro = minify(prepared, inputs, settings, out_dir, accuracy=not culprit.error, progress=progress)
        diagnosis = dataclasses.replace(diagnosis, repro=str(repro) if repro else None)
    (out_dir / "diagnosis.json").write_text(json.dumps(dataclasses.asdict(diagnosis), indent=2) + "\n")
    (out_dir / "diagnosis.txt").write_text(diagnosis.summary() + "\n")
    return diagnosis
