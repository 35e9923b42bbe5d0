"""How much memory a language model's load takes, as a worker loads it (`make bench-load SRC=dir`).

    .venv/bin/python -m bench.studies.load_memory DIR [--dtypes float32,bfloat16] [--weights packed,int8]

A worker (handlers/text_generation.py) reads the checkpoint in its own dtype, makes each linear
layer's kernel (packed, or on int8 weights) from the layer converted to the served dtype one at a
time, reads the input embedding's rows from the file, converts what is left and gives back to the
system what its allocator kept of what the load freed (handlers/generation/weights.py). Its peak is
what the memory plan leaves room for at a start. Here each served dtype and weight kind is that
load in a process of its own, with the kit's allocator preloaded as a worker has it (tcmalloc), and
without what comes after the load (the accuracy guard, whose float answers the archive ships, and
compiling). bfloat16 is left out, said why, on a CPU that does not compute it.
Results: bench/results/load-memory-<time>/results.json, report.md and the table printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.results import RESULTS, study_report
from kit.layout import PREFERRED_ALLOCATOR
from kit.paths import ROOT
from kit.pin_worker import allocator_library

WEIGHTS = ("packed", "int8")
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Load:
    checkpoint: str  # the checkpoint's dtype, as stored
    dtype: str  # served
    weights: str  # packed or int8
    peak_gib: float  # VmHWM: the load's most, with the process's Python and libraries
    rss_gib: float  # VmRSS after it, what the allocator kept given back
    seconds: float
    parts_mb: dict[str, float]  # the READY line's parts (weights.weight_parts)


def status_gib(field: str) -> float:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 2**20


def load(directory: Path, dtype: str, weights: str) -> Load:
    """The worker's load in this process (its only work: the peak is the load's)."""
    import torch

    from handlers.free_memory import give_back
    from handlers.generation.file_embedding import stored_tensors
    from handlers.generation.weights import served_form, weight_parts
    from handlers.loaders import causal_lm_as_saved

    start = time.perf_counter()
    model = causal_lm_as_saved(directory)
    served_form(model, directory, getattr(torch, dtype), int8=weights == "int8")
    give_back()
    seconds = time.perf_counter() - start
    stored = {str(s.dtype).removeprefix("torch.") for s in stored_tensors(directory)}
    parts = {part: size / 1e6 for part, size in weight_parts(model).items()}
    return Load("/".join(sorted(stored)), dtype, weights, status_gib("VmHWM"), status_gib("VmRSS"), seconds, parts)


def measured(directory: Path, dtype: str, weights: str) -> Load:
    """load() in a fresh process with the kit's allocator preloaded."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    library = allocator_library(Path(sys.prefix) / "lib", PREFERRED_ALLOCATOR.value)
    if library is not None and library.exists():
        env["LD_PRELOAD"] = str(library)
    code = "import dataclasses, json, sys; from pathlib import Path; from bench.studies.load_memory import load; "
    code += "print(json.dumps(dataclasses.asdict(load(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))))"
    run = subprocess.run(
        [sys.executable, "-c", code, str(directory), dtype, weights], env=env, cwd=ROOT, capture_output=True, text=True
    )
    if run.returncode != 0:
        raise RuntimeError(f"loading {directory} as {dtype} {weights} failed:\n{run.stderr[-2000:]}")
    return Load(**json.loads(run.stdout.strip().splitlines()[-1]))


def table(loads: list[Load], skipped: list[str], header: str) -> str:
    lines = [
        header,
        "",
        "| checkpoint | served | weights | peak | RSS after | load | weights' parts |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in loads:
        parts = ", ".join(f"{part} {size:.0f} MB" for part, size in r.parts_mb.items())
        lines.append(
            f"| {r.checkpoint} | {r.dtype} | {r.weights} | {r.peak_gib:.2f} GiB | {r.rss_gib:.2f} GiB "
            f"| {r.seconds:.1f} s | {parts} |"
        )
    return "\n".join([*lines, *(["", *skipped] if skipped else [])]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help="a Hugging Face causal language model's directory")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="served dtypes (default float32,bfloat16)")
    parser.add_argument("--weights", default=",".join(WEIGHTS), help="packed and/or int8 (default both)")
    args = parser.parse_args(argv)
    from handlers.backends import bf16_isa, cpu_flags

    dtypes, weights = args.dtypes.split(","), args.weights.split(",")
    if unknown := sorted({*dtypes} - {*DTYPES}) + sorted({*weights} - {*WEIGHTS}):
        parser.error(f"unknown {', '.join(unknown)}: dtypes are {', '.join(DTYPES)}; weights {', '.join(WEIGHTS)}")
    skipped = []
    if "bfloat16" in dtypes and bf16_isa(cpu_flags()) is None:
        dtypes.remove("bfloat16")
        skipped.append("bfloat16 left out: this CPU computes no bf16 (AMX_BF16 or AVX512_BF16).")
    loads = []
    for dtype in dtypes:
        for kind in weights:
            print(f"[load-memory] {args.directory} as {dtype}, {kind} weights", file=sys.stderr)
            loads.append(measured(args.directory, dtype, kind))
    out = RESULTS / f"load-memory-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    study_report(
        out,
        "A language model's load: its peak and what it keeps",
        f"{args.directory.name}, one load each in a fresh process, {PREFERRED_ALLOCATOR.value} preloaded",
        lambda header: table(loads, skipped, header),
        {"loads": loads},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
