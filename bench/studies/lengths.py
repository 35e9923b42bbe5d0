"""Which length buckets a text model should pad to (what `make bench-lengths` runs): one mix of
texts served in-process, padded as each candidate bucket set pads it, so the default is a
measured choice.

    .venv/bin/python -m bench.studies.lengths [--models a,b] [--variants inductor,openvino] [--seconds 4] [--rounds 3]

The mix: MIX_SIZE texts cut from the kit's sentences, their token counts log-uniform from 4 to the
model's max_length (as many under 8 tokens as from 64 to 128: queries and titles beside passages).
One process per variant, as a 1-thread worker: the archive's handler with a bucket at every
length (a precompiled backend's artifact rebuilt so, as `make archive` would), every length
warmed, so one compiled model serves each candidate's padding (the graphs and IR keep the length
dynamic: docs/backends.md). Then, in each of `rounds` rounds and in a shuffled order, whole passes of
the mix run for at least `seconds` per candidate, each text padded by the handler's own collate; the
median is reported.
A candidate's start is its lengths x the warm-up per length, measured on every length but the
first (which pays the graph's one compile, whatever the set). Results: bench/results/lengths-<time>/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.results import RESULTS, RunEnvironment
from handlers.archive_files import is_archive
from handlers.settings import LONGEST_TEXT, TextSettings
from kit.models import Medium, Model, model_names
from kit.paths import ROOT, process_environment
from kit.variant import Variant

MIX_SIZE, MIX_SEED, SHORTEST = 64, 0, 4
# Candidates, coarse to fine; () pads every text to max_length (the kit before buckets).
BUCKET_SETS: dict[str, tuple[int, ...]] = {
    "none": (),
    "32,64": (32, 64),
    "16,32,64": (16, 32, 64),
    "8,16,32,64": (8, 16, 32, 64),
    "every 16": tuple(range(16, LONGEST_TEXT, 16)),
    "every 8": tuple(range(8, LONGEST_TEXT, 8)),
    "every 4": tuple(range(4, LONGEST_TEXT, 4)),
    "every token": tuple(range(2, LONGEST_TEXT)),
}
COMPILED_SET = "every token"  # a graph that serves every length serves every candidate's
DEFAULT_SET = TextSettings.length_buckets  # the kit's default, the table's reference


@dataclasses.dataclass(frozen=True)
class SetResult:
    variant: str
    name: str
    lengths: int  # how many lengths the handler pads to (and warms at start)
    items_per_s: float  # median of the rounds
    rounds: list[float]
    warmup_s: float  # lengths x the warm-up per length measured at start


@dataclasses.dataclass(frozen=True)
class VariantRun:
    variant: str
    start_s: float  # precompile + compile + warm-up of every length
    warmup_per_length_s: float
    sets: list[SetResult]


def is_text(model: str) -> bool:
    return Model.load(model).task.medium is Medium.TEXT


def mix_lengths(max_length: int, size: int = MIX_SIZE, seed: int = MIX_SEED) -> list[int]:
    """Token counts (with the special tokens) at the quantiles of a log-uniform law on
    [SHORTEST, max_length], so no sampling noise, in a shuffled serving order."""
    lengths = [round(SHORTEST * (max_length / SHORTEST) ** ((i + 0.5) / size)) for i in range(size)]
    random.Random(seed).shuffle(lengths)
    return lengths


def texts_of(tokenizer, source: str, lengths: list[int]) -> list[str]:
    """Prefixes of `source` that tokenize to each length (special tokens included)."""
    tokenizer.enable_truncation(max(lengths))
    offsets = tokenizer.encode(source).offsets  # (start, end) per token; the special ones are (0, 0)
    return [source[: offsets[n - 2][1]] for n in lengths]  # n - 2: without [CLS] and [SEP]


def run_child(archive: Path, seconds: int, rounds: int) -> VariantRun:
    import torch

    from handlers.archive import load_archived
    from handlers.calibration import SENTENCES
    from handlers.optimize import graphs_compiled, optimize, warm_up
    from handlers.precompile import precompile

    torch.set_num_threads(1)
    started = time.perf_counter()
    archived = load_archived(archive, {"length_buckets": list(BUCKET_SETS[COMPILED_SET])})
    handler, compiled = archived.handler, archived.settings
    precompile(handler, archived.model, archive, progress=lambda message: None)  # nothing for a compiler
    first, *others = handler.examples(1)
    # The first length pays the compile of the one dynamic graph, whatever the bucket set: the
    # others cost what each more bucket adds to a worker's start, warmed as optimize warms them.
    optimized = optimize(archived.model, compiled, [first], archive, handler.samples.checks(1))
    lengths_warmed = warm_up(optimized, others, compiled.warmup_iterations)
    start_s = time.perf_counter() - started
    # No others: the model pads to one length (no attention mask), and more buckets cost nothing.
    per_length = (lengths_warmed.compile_seconds + lengths_warmed.warmup_seconds) / max(len(others), 1)
    lengths = mix_lengths(compiled.max_length)
    items = [
        handler.decode({"body": text.encode()}) for text in texts_of(handler.tokenizer, " ".join(SENTENCES), lengths)
    ]
    candidates = {name: dataclasses.replace(compiled, length_buckets=b) for name, b in BUCKET_SETS.items()}
    graphs, measured = graphs_compiled(), {name: [] for name in candidates}
    order = random.Random(MIX_SEED)
    for _ in range(rounds):
        for name in order.sample(list(candidates), len(candidates)):
            handler.settings = candidates[name]  # what collate pads to
            done, begin = 0, time.perf_counter()
            while time.perf_counter() - begin < seconds:
                for item in items:
                    inputs = handler.collate([item], 1)  # as the handler serves: collated outside inference
                    with torch.inference_mode():  # mode, run inside it (the graphs' guards expect both)
                        optimized(*inputs)
                done += len(items)
            measured[name].append(round(done / (time.perf_counter() - begin), 2))
    if graphs_compiled() != graphs:
        raise RuntimeError("a padded length recompiled the model: the numbers would time the compiler")
    return VariantRun(
        archive.parent.name,
        round(start_s, 1),
        round(per_length, 3),
        [
            SetResult(
                archive.parent.name,
                name,
                len(settings.lengths),
                round(statistics.median(measured[name]), 2),
                measured[name],
                round(len(settings.lengths) * per_length, 1),
            )
            for name, settings in candidates.items()
        ],
    )


def measure(variant: Variant, model: str, seconds: int, rounds: int) -> VariantRun:
    """One child process, with the variant's Python and one OpenMP thread, as a 1-thread worker."""
    command = [
        str(variant.environment / "bin" / "python"),
        "-m",
        "bench.studies.lengths",
        "--child",
        str(variant.archive(model)),
        "--seconds",
        str(seconds),
        "--rounds",
        str(rounds),
    ]
    env = {**process_environment(dict(os.environ)), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{variant.name}/{model} failed:\n{done.stderr[-3000:]}")
    raw = json.loads(done.stdout.splitlines()[-1])
    return VariantRun(**{**raw, "sets": [SetResult(**s) for s in raw["sets"]]})


def report(model: str, runs: list[VariantRun], env: RunEnvironment, seconds: int, rounds: int) -> list[str]:
    default = next(name for name, buckets in BUCKET_SETS.items() if buckets == DEFAULT_SET)
    lines = [
        f"{model}: CPU {env.cpu_model}; commit {env.git_commit}; one thread, batch 1; {MIX_SIZE} texts of"
        f" {SHORTEST} to max_length tokens, log-uniform; median of {rounds} rounds of whole passes for >= {seconds} s;"
        " `make bench-lengths`",
        "",
        f"| variant | buckets | lengths | mix items/s (rounds) | vs {default} | warm-up s |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        reference = next(s.items_per_s for s in run.sets if s.name == default)
        lines += [
            f"| {run.variant} | {s.name} | {s.lengths} | {s.items_per_s} ({', '.join(map(str, s.rounds))}) |"
            f" {s.items_per_s / reference:.2f}× | {s.warmup_s} |"
            for s in run.sets
        ]
    starts = "; ".join(f"{r.variant} {r.start_s} s, {r.warmup_per_length_s * 1000:.0f} ms per length" for r in runs)
    return [*lines, "", f"Start with a bucket at every length (compile + warm-up): {starts}."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="", help="comma list (default: every text model of config/models/)")
    parser.add_argument("--variants", default="inductor,openvino")
    parser.add_argument("--seconds", type=int, default=4, help="per candidate and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(dataclasses.asdict(run_child(args.child, args.seconds, args.rounds))))
        return 0
    variants = [Variant.load(v) for v in args.variants.split(",")]
    models = args.models.split(",") if args.models else [m for m in model_names() if is_text(m)]
    if not_text := [m for m in models if not is_text(m)]:
        print(f"[lengths] {', '.join(not_text)}: not text models; length buckets pad text only", file=sys.stderr)
        return 2
    if missing := [str(v.archive(m)) for v in variants for m in models if not is_archive(v.archive(m))]:
        print(f"[lengths] missing archives: {', '.join(missing)}; build them with `make archive`", file=sys.stderr)
        return 2
    env = RunEnvironment.capture()
    out = RESULTS / f"lengths-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    lines, rows = [], []
    for model in models:
        runs = []
        for variant in variants:
            started = time.monotonic()
            print(
                f"[lengths] {model} {variant.name}: compile with a bucket at every length, then {len(BUCKET_SETS)}"
                f" bucket sets x {args.rounds} rounds x {args.seconds} s",
                flush=True,
            )
            runs.append(measure(variant, model, args.seconds, args.rounds))
            print(f"[lengths] {model} {variant.name}: done in {time.monotonic() - started:.0f} s", flush=True)
        rows += [{"model": model, **dataclasses.asdict(r)} for r in runs]
        lines += [*report(model, runs, env, args.seconds, args.rounds), ""]
    (out / "results.json").write_text(json.dumps({"environment": dataclasses.asdict(env), "runs": rows}, indent=2))
    (out / "report.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"[lengths] results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
