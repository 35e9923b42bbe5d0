"""Compare serving configurations on the real server with apache-bench.

    .venv/bin/python -m bench --plan default        # what `make bench` runs (PLAN=quick|full|path.yaml)
    .venv/bin/python -m bench --plan tune --write-preset tuned
    .venv/bin/python -m bench --plan generate --models lm [--rounds 3 --seconds 60 --peers none ...]

A plan is a file, bench/plans/NAME.yaml (or a path); its `kind` says which driver runs it: the
serving rows below, or a language model against its peers (kind: generate, bench/generate/run.py),
whose settings the generate options override.

Builds the archives the plan needs first (model_store/build.py skips the up-to-date ones).
Results go to bench/results/<timestamp>/ (results.json, report.md, throughput.png);
bench/results/latest points to the newest run.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench.generate import run as generate
from bench.generate.tune import Tuning, tune_models
from bench.plan import GENERATE, Plan, PlanError, load_plan, read_plan
from bench.report import write_report
from bench.results import RESULTS, BenchRun, RunEnvironment
from bench.runner import log, run_plan
from bench.tune import write_tuned_preset
from bench.versus.report import write_versus_report
from bench.versus.rounds import run_rounds
from handlers.typed_config import SettingsError
from kit.models import Model, Task, check_models
from kit.paths import ROOT
from kit.variant import Variant


def build_archives(plan: Plan) -> bool:
    """The archives of every variant and model the plan runs; False if a build failed."""
    for variant, models in plan.archives.items():
        if Variant.load(variant).refusal():
            continue  # its rows are skipped, with the reason
        command = [sys.executable, "-m", "model_store.build", "--variants", variant, "--models", ",".join(models)]
        if subprocess.run(command, cwd=ROOT).returncode != 0:
            log(f"ERROR: building the {variant} archives of {models} failed (output above)")
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--plan", default="default", help="quick | default | full | tune | path/to/plan.yaml")
    parser.add_argument("--out", type=Path, default=None, help="results directory (default: bench/results/<time>)")
    parser.add_argument("--models", default="", help="comma list: run the plan for these models instead of its own")
    parser.add_argument("--write-preset", default="", help="write the fastest layout as config/presets/NAME.yaml")
    lm = parser.add_argument_group(
        "language models (--write-preset): their variant and sequences (bench/generate/tune.py)"
    )
    lm.add_argument("--streams", type=int, default=Tuning.streams, help="the concurrent streams to tune for")
    lm.add_argument("--itl-ms", type=float, default=Tuning.itl_ms, help="the ITL p50 the choice must meet (0: none)")
    lm.add_argument("--lookup", type=int, default=Tuning.lookup, help="prompt lookup's drafts tried (0: not tried)")
    lm.add_argument("--workload", default=Tuning.workload, help="the traffic measured: text, copy (edits), json_schema")
    lm.add_argument("--lm-rounds", type=int, default=Tuning.rounds)
    lm.add_argument("--lm-seconds", type=float, default=Tuning.seconds, help="per candidate and round")
    lm.add_argument(
        "--lm-variants",
        default="",
        help="comma list (default: inductor and openvino, and their bf16 and int8-weights variants where computed)",
    )
    streamed = parser.add_argument_group("a generate plan's settings, over the plan file's (kind: generate)")
    for option in GENERATE_OPTIONS:
        streamed.add_argument(f"--{option}", default=None)
    args = parser.parse_args(argv)
    try:
        name, raw = read_plan(args.plan)
    except PlanError as error:
        print(f"[bench] ERROR: {error}", file=sys.stderr)
        return 2
    if raw.get("kind") == GENERATE:
        return generate_plan(name, raw, args)
    if given := [f"--{o}" for o in GENERATE_OPTIONS if getattr(args, o) is not None]:
        print(
            f"[bench] ERROR: {', '.join(given)} set a generate plan's settings; plan {name!r} is a serving plan "
            "(its seconds and rounds are in its file)",
            file=sys.stderr,
        )
        return 2
    command = "python -m bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    requested = [m for m in args.models.split(",") if m]
    try:
        check_models(requested)
        tuning = Tuning(args.streams, args.lm_rounds, args.lm_seconds, args.itl_ms, args.lookup, args.workload)
    except (SettingsError, ValueError) as error:
        print(f"[bench] ERROR: {error}", file=sys.stderr)
        return 2
    languages = [m for m in requested if Model.load(m).task is Task.TEXT_GENERATION]
    if languages and not args.write_preset:
        print(
            f"[bench] ERROR: {languages} generate text: `make bench PLAN=generate MODELS=...` measures a language "
            "model, `make tune MODELS=...` tunes it",
            file=sys.stderr,
        )
        return 2
    others, base = [m for m in requested if m not in languages], None
    if others or not languages:  # the plan's own models when none are named
        status, path = bench_plan(args, others, command)
        if status or not languages:
            return status
        base = yaml.safe_load(path.read_text()) if path else None  # the other models' preset: LMs join it
    variants = [v for v in args.lm_variants.split(",") if v] or None
    return tune_models(
        languages,
        tuning,
        variants,
        args.write_preset,
        base,
        args.out or RESULTS / f"tune-lm-{time.strftime('%Y%m%d-%H%M%S')}",
    )


# What a generate plan's file sets and the command line may override (bench/generate/run.py's options).
GENERATE_OPTIONS = ("rounds", "seconds", "concurrency", "peers", "precisions", "backends", "workloads")


def generate_plan(name: str, raw: dict, args: argparse.Namespace) -> int:
    """A kind: generate plan, run by bench/generate/run.py with the file's settings under the command line's."""
    if not args.models:
        print(f"[bench] ERROR: plan {name!r} measures a language model of yours: give MODELS=lm", file=sys.stderr)
        return 2
    if unknown := sorted(set(raw) - {"description", "kind", *GENERATE_OPTIONS}):
        print(
            f"[bench] ERROR: plan {name!r}: unknown key(s) {unknown}; valid: {list(GENERATE_OPTIONS)}", file=sys.stderr
        )
        return 2
    argv = ["--model", args.models]
    for option in GENERATE_OPTIONS:
        value = getattr(args, option)
        if value is None and option in raw:
            value = raw[option] if not isinstance(raw[option], list) else ",".join(map(str, raw[option]))
        if value not in (None, ""):
            argv += [f"--{option}", str(value)]
    return generate.main(argv)


def bench_plan(args: argparse.Namespace, models: list[str], command: str) -> tuple[int, Path | None]:
    """The plan run for `models` (its own when none); its exit status and the preset it wrote."""
    try:
        plan = load_plan(args.plan, models)
    except PlanError as error:
        print(f"[bench] ERROR: {error}", file=sys.stderr)
        return 2, None
    if not build_archives(plan):
        return 1, None
    out_dir = args.out or RESULTS / time.strftime("%Y%m%d-%H%M%S")
    models = sorted({r.model for r in plan.rows})
    log(
        f"plan {plan.name!r}: {len(plan.rows)} rows over {models}, estimated {plan.estimate_s() / 60:.0f} min "
        f"(more on a cold compile cache); results in {out_dir}"
    )
    run = BenchRun(plan, command, RunEnvironment.capture())
    # Rounds: the kit's rows and the served peers interleaved (bench/versus/rounds.py), their own report.
    execute, report = (run_rounds, write_versus_report) if plan.run.rounds > 1 else (run_plan, write_report)
    try:
        execute(run, out_dir)
    except KeyboardInterrupt:
        log("interrupted: servers stopped; the report has the rows measured so far")
        return 130, None  # as a shell reports Ctrl-C: no preset from a run cut short
    finally:
        report(out_dir, run)
        log(f"report: {out_dir / 'report.md'}")
    print((out_dir / "report.md").read_text())
    served = [r for r in run.results if r.kind == "served"]  # the kit's rows, not the peers'
    path = None
    if args.write_preset and served:
        try:
            path = write_tuned_preset(args.write_preset, served, [f for f in run.failed if f.kind == "served"])
        except ValueError as error:
            log(f"ERROR: no preset written: {error}")
            return 1, None
        log(f"fastest layout written to {path}; serve it with `make serve CONFIG={args.write_preset}`")
    for failure in run.failed:
        log(f"row failed: {failure.model} / {failure.name}: {failure.reason}")
    # Failed rows are in the report; the run fails only when a result it exists for is missing.
    if lost := run.lost():
        log(f"ERROR: the run lost what its result depends on: {'; '.join(lost)}")
        return 1, None
    return 0, path


if __name__ == "__main__":
    sys.exit(main())
