"""Which length buckets a text model should pad to (what `make bench-lengths` runs): one mix of
texts served in-process with each bucket set, so the default is a measured choice.

    .venv/bin/python -m bench.lengths [--models bert] [--variants inductor,openvino] [--seconds 10]

The mix: MIX_SIZE texts cut from the kit's sentences, their token counts log-uniform from 4 to the
model's max_length (as many under 8 tokens as 64-128: queries and titles beside passages). Each
(variant, bucket set) runs in its own process, as a worker would: the archive's handler with its
`length_buckets` replaced, compiled (a precompiled backend's artifact rebuilt for the set, as
`make archive` would build it), every bucket warmed, then the mix timed at batch 1 on one thread,
each text padded by the handler's own collate. Results: bench/results/lengths-<time>/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.results import RunEnvironment
from handlers.settings import TextSettings
from kit.models import Medium, Model
from kit.paths import ROOT, process_environment
from kit.variant import Variant

RESULTS = Path(__file__).resolve().parent / "results"
MIX_SIZE, MIX_SEED, SHORTEST = 64, 0, 4
# Candidates, coarse to fine; () pads every text to max_length (the kit before buckets).
BUCKET_SETS: tuple[tuple[int, ...], ...] = (
    (),
    (32, 64),
    (16, 32, 64),
    (8, 16, 32, 64),
    (8, 16, 24, 32, 48, 64, 96),
    tuple(range(8, 128, 8)),
)
DEFAULT_SET = TextSettings.length_buckets  # the kit's default, the table's reference


@dataclasses.dataclass(frozen=True)
class SetResult:
    variant: str
    buckets: list[int]
    lengths: list[int]  # what the handler pads to: the buckets below max_length, then max_length
    start_s: float  # precompile (precompiled backends) + compile + warm-up of every length
    items_per_s: float

    @property
    def label(self) -> str:
        return ",".join(map(str, self.buckets)) or "none"


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


def run_child(archive: Path, buckets: tuple[int, ...], seconds: int, work_dir: Path) -> SetResult:
    import torch

    from handlers.archive import extract, load_archived
    from handlers.calibration import SENTENCES
    from handlers.optimize import optimize
    from handlers.precompile import precompile

    torch.set_num_threads(1)
    started = time.perf_counter()
    model_dir = extract(archive, work_dir)
    archived = load_archived(model_dir, {"length_buckets": list(buckets)})
    handler, settings = archived.handler, archived.settings
    precompile(handler, archived.model, model_dir, progress=lambda message: None)  # nothing for a compiler
    optimized = optimize(archived.model, settings, handler.examples(1), model_dir, handler.checks(1))
    start_s = time.perf_counter() - started
    lengths = mix_lengths(settings.max_length)
    items = [
        handler.decode({"body": text.encode()}) for text in texts_of(handler.tokenizer, " ".join(SENTENCES), lengths)
    ]
    done = 0
    with torch.inference_mode():
        begin = time.perf_counter()
        while time.perf_counter() - begin < seconds:
            for item in items:
                optimized(*handler.collate([item], 1))
            done += len(items)
        elapsed = time.perf_counter() - begin
    return SetResult(archive.parent.name, list(buckets), list(settings.lengths), round(start_s, 1),
                     round(done / elapsed, 2))  # fmt: skip


def measure(variant: Variant, model: str, buckets: tuple[int, ...], seconds: int, work_dir: Path) -> SetResult:
    """One child process, with the variant's Python and one OpenMP thread, as a 1-thread worker."""
    command = [str(variant.environment / "bin" / "python"), "-m", "bench.lengths", "--child", str(variant.archive(model)),
               "--buckets", ",".join(map(str, buckets)), "--seconds", str(seconds), "--work-dir", str(work_dir)]  # fmt: skip
    env = {**process_environment(dict(os.environ)), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    shutil.rmtree(work_dir, ignore_errors=True)  # the extracted archive: hundreds of MB
    if done.returncode != 0:
        raise RuntimeError(f"{variant.name}/{model} with buckets {list(buckets)} failed:\n{done.stderr[-3000:]}")
    return SetResult(**json.loads(done.stdout.splitlines()[-1]))


def report(model: str, results: list[SetResult], env: RunEnvironment, seconds: int) -> list[str]:
    default = {r.variant: r.items_per_s for r in results if tuple(r.buckets) == DEFAULT_SET}
    return [
        f"{model}: CPU {env.cpu_model}; commit {env.git_commit}; one thread, batch 1; {MIX_SIZE} texts of"
        f" {SHORTEST} to max_length tokens, log-uniform; {seconds} s per set; `make bench-lengths`",
        "",
        f"| variant | buckets | padded to | start s | mix items/s | vs {','.join(map(str, DEFAULT_SET))} |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r.variant} | {r.label} | {', '.join(map(str, r.lengths))} | {r.start_s} | {r.items_per_s} |"
            f" {f'{r.items_per_s / default[r.variant]:.2f}×' if r.variant in default else ''} |"
            for r in results
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert")
    parser.add_argument("--variants", default="inductor,openvino")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--buckets", default="", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        buckets = tuple(int(n) for n in args.buckets.split(",") if n)
        print(json.dumps(dataclasses.asdict(run_child(args.child, buckets, args.seconds, args.work_dir))))
        return 0
    models, variants = args.models.split(","), [Variant.load(v) for v in args.variants.split(",")]
    if not_text := [m for m in models if Model.load(m).task.medium is not Medium.TEXT]:
        print(f"[lengths] {', '.join(not_text)}: not text models; length buckets pad text only", file=sys.stderr)
        return 2
    if missing := [str(v.archive(m)) for v in variants for m in models if not v.archive(m).is_file()]:
        print(f"[lengths] missing archives: {', '.join(missing)}; build them with `make archive`", file=sys.stderr)
        return 2
    env = RunEnvironment.capture()
    out = RESULTS / f"lengths-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    lines, rows = [], []
    for model in models:
        results = []
        for variant in variants:
            for buckets in BUCKET_SETS:
                started = time.monotonic()
                result = measure(variant, model, buckets, args.seconds, out / "extracted")
                results.append(result)
                print(f"[lengths] {model} {variant.name} buckets {result.label}: start {result.start_s} s,"
                      f" {result.items_per_s} items/s ({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
        rows += [{"model": model, **dataclasses.asdict(r)} for r in results]
        lines += [*report(model, results, env, args.seconds), ""]
    (out / "results.json").write_text(json.dumps({"environment": dataclasses.asdict(env), "rows": rows}, indent=2))
    (out / "report.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"[lengths] results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
