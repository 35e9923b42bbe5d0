"""Where a language model's decode step goes: the linear layers' kernels against the rest, and the
rate at which the kernels read their weights against a plain read of as many bytes
(`make bench-decode MODELS=lm`).

    .venv/bin/python -m bench.studies.decode_split --models lm [--rounds 5] [--streams 1,16]

A decode step reads every weight of the model once, whatever its rows: on a CPU, one stream's
time between tokens is mostly that read. A process laid out as the server's worker (its threads,
its allocator: bench/inprocess.py) loads the model's archive as a worker does (packed or int8
kernels, compiled graphs from the archive) and, per round and per count of streams, starts that
many greedy sequences of a 64-token prompt and times each decode step after their prompts: the
whole step (scheduler, forward, sampling) and the time spent inside the linear kernels
(handlers/generation/linears.py: counted by the kit's library for the layers it holds, timed
around each call for the others). The kernels' bytes over their time is the rate they read at; a
sum over a float32 tensor of as many bytes, timed in the same process with the same threads, is
the rate a plain read reaches on this machine. Then, with one of the streams computing its prompt
instead (the others decoding), each of MIXED_STEPS steps admits a new prompt of a chunk's tokens
(`prefill_chunk`, answered at once, each new to the prefix cache) and computes it beside the decode
rows: what every stream waits for while prompts arrive, and where a busy server's time goes. Per
round the median step; the tables: medians of the rounds (min-max). Served time between tokens adds
what serving a token costs (its reply through TorchServe): `make bench PLAN=generate` measures that
end to end.
Results: bench/results/decode-<time>/results.json, report.md and the table printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.inprocess import child_environment
from bench.results import RESULTS, study_report
from kit.models import Model, Task
from kit.paths import ROOT
from kit.serve_config import ServeConfig
from kit.topology import read_topology

PROMPT_TOKENS = 64
STEPS = 40  # decode steps timed per round and count of streams
WARM_STEPS = 3  # steps after the prompts, not timed (the first decode shapes of a round)
MIXED_STEPS = 5  # steps with a prompt's part timed per round and count of streams, after one not timed
PART_TOKENS = 256  # a part's tokens where the model computes every prompt whole (prefill_chunk 0)


@dataclasses.dataclass(frozen=True)
class Split:
    streams: int
    threads: int
    kernel_bytes: int  # read by the linear kernels in a step
    step_ms: list[float]  # per round: the median decode step
    kernels_ms: list[float]  # per round: the median time inside the linear kernels
    plain_gbps: list[float]  # per round: a sum over as many bytes
    part_tokens: int = 0  # the prompt tokens of a mixed step (below): the engine's chunk
    mixed_ms: list[float] = dataclasses.field(default_factory=list)  # per round: the median step with a part
    mixed_kernels_ms: list[float] = dataclasses.field(default_factory=list)  # ... and its time in the kernels

    @property
    def rest_ms(self) -> list[float]:
        return [s - k for s, k in zip(self.step_ms, self.kernels_ms, strict=True)]

    @property
    def mixed_rest_ms(self) -> list[float]:
        return [s - k for s, k in zip(self.mixed_ms, self.mixed_kernels_ms, strict=True)]

    @property
    def kernels_gbps(self) -> list[float]:
        return [self.kernel_bytes / ms / 1e6 for ms in self.kernels_ms]


def measure(archive: Path, name: str, rounds: int, streams: list[int]) -> list[Split]:
    """In this process: the archive's model loaded as a worker loads it, its decode steps timed."""
    import torch
    import yaml

    from handlers.archive_files import MODEL_CONFIG
    from handlers.calibration import SENTENCES
    from handlers.generation import linears
    from handlers.generation.sequences import Discard, Generation
    from handlers.outside_context import worker_context
    from handlers.text_generation import TextGenerationHandler

    settings = yaml.safe_load((archive / MODEL_CONFIG).read_text())["handler"]
    handler = TextGenerationHandler()
    handler.initialize(worker_context(archive, name, settings))
    engine = handler.engine
    read = handler.weight_bytes["linear kernels"]  # what the READY line states (handlers/generation/weights.py)
    plain = torch.ones(read // 4)
    inside = [0.0]

    def timed(kernel: linears.Kernel) -> linears.Kernel:
        def call(x: torch.Tensor) -> torch.Tensor:
            started = time.perf_counter()
            out = kernel(x)
            inside[0] += time.perf_counter() - started
            return out

        call.out_features = kernel.out_features  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    # Layers the kit's library holds are called by the graphs without Python: the library counts
    # their time (keyed_seconds); the others' calls are timed here.
    linears.KERNELS.update(
        {key: timed(kernel) for key, kernel in linears.KERNELS.items() if not isinstance(kernel, linears.Held)}
    )
    held = any(isinstance(k, linears.Held) for k in linears.KERNELS.values())  # only where the library loaded

    def held_seconds() -> float:
        return torch.ops.kit_rows.keyed_seconds() if held else 0.0

    text = handler.tokenizer(" ".join(SENTENCES))["input_ids"]
    prompt = tuple(text[:PROMPT_TOKENS])
    part = engine.prefill_chunk or PART_TOKENS
    chunk = tuple((text * (part // len(text) + 1))[:part])
    fresh = itertools.count(1)  # a first token each part's prompt has alone: no prefix-cache hit
    vocabulary = len(handler.tokenizer)

    def decoding(count: int, steps: int) -> None:
        """`count` sequences past their prompts, each decoding through `steps` steps more: long
        enough that none ends in them (those whose prompts were done first decode meanwhile)."""
        for index in range(count):
            generation = Generation((*prompt[:-1], prompt[-1 - index]), steps + count + 1, ignore_eos=True)
            engine.submit(generation, Discard())
        while any(s.prefilling for s in engine.active.values()) or engine.waiting:
            engine.step()

    def timed_steps(count: int, submit: Callable[[], None] = lambda: None) -> tuple[float, float]:
        """The median step and its median time in the kernels, ms, over `count` steps after one
        not timed; `submit` before each."""
        steps, kernels = [], []
        for _ in range(count + 1):
            submit()
            inside[0] = -held_seconds()
            started = time.perf_counter()
            engine.step()
            steps.append(1000 * (time.perf_counter() - started))
            kernels.append(1000 * (inside[0] + held_seconds()))
        while engine.busy:
            engine.step()
        return statistics.median(steps[1:]), statistics.median(kernels[1:])

    def new_prompt() -> None:
        """A prompt of `part` tokens, answered in the step that computes it."""
        engine.submit(Generation((next(fresh) % vocabulary, *chunk[1:]), 1, ignore_eos=True), Discard())

    results: dict[int, tuple[list[float], ...]] = {count: ([], [], [], [], []) for count in streams}
    for _ in range(rounds):
        for count in streams:
            step_ms, kernels_ms, plain_gbps, mixed_ms, mixed_kernels_ms = results[count]
            decoding(count, STEPS + WARM_STEPS)
            for _ in range(WARM_STEPS - 1):  # the first decode shapes of a round (timed_steps skips one more)
                engine.step()
            step, kernels = timed_steps(STEPS)
            step_ms.append(step)
            kernels_ms.append(kernels)
            started = time.perf_counter()
            plain.sum()
            plain_gbps.append(plain.numel() * 4 / (time.perf_counter() - started) / 1e9)
            decoding(count - 1, MIXED_STEPS + 1)  # one of the streams computes its prompt instead
            step, kernels = timed_steps(MIXED_STEPS, new_prompt)
            mixed_ms.append(step)
            mixed_kernels_ms.append(kernels)
    threads = torch.get_num_threads()
    return [
        Split(count, threads, read, step_ms, kernels_ms, plain_gbps, part, mixed_ms, mixed_kernels_ms)
        for count, (step_ms, kernels_ms, plain_gbps, mixed_ms, mixed_kernels_ms) in results.items()
    ]


def spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def table(splits: list[Split], header: str) -> str:
    lines = [
        header,
        "",
        "| streams | threads | decode step, ms | in the linear kernels, ms | the rest, ms "
        "| kernels' bytes a step | kernels read at, GB/s | a plain read, GB/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in splits:
        lines.append(
            f"| {s.streams} | {s.threads} | {spread(s.step_ms)} | {spread(s.kernels_ms)} | {spread(s.rest_ms)} "
            f"| {s.kernel_bytes / 1e9:.2f} GB | {spread(s.kernels_gbps)} | {spread(s.plain_gbps)} |"
        )
    mixed = [s for s in splits if s.mixed_ms]
    if mixed:
        lines += [
            "",
            "A step that computes a new prompt's part beside the other streams' decode rows:",
            "",
            "| streams | prompt tokens | decode rows | step, ms | in the linear kernels, ms | the rest, ms |",
            "|---|---|---|---|---|---|",
        ]
        for s in mixed:
            lines.append(
                f"| {s.streams} | {s.part_tokens} | {s.streams - 1} | {spread(s.mixed_ms)} "
                f"| {spread(s.mixed_kernels_ms)} | {spread(s.mixed_rest_ms)} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", required=True, help="a text-generation model file (make model NAME=... SRC=...)")
    parser.add_argument("--variant", default="", help="the archive's variant (default: the optimized preset's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--streams", default="1,16", help="counts of concurrent sequences, comma-separated")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    name = args.models.split(",")[0]
    if Model.load(name).task is not Task.TEXT_GENERATION:
        print(f"[decode] ERROR: {name} is not a text-generation model; name one", file=sys.stderr)
        return 2
    streams = [int(count) for count in args.streams.split(",")]
    config = ServeConfig.from_preset("optimized", models=[name], **({"variant": args.variant} if args.variant else {}))
    archive = config.archives()[name]
    if args.measure:
        print(json.dumps([dataclasses.asdict(s) for s in measure(archive, name, args.rounds, streams)]))
        return 0
    threads = len(read_topology().cpus)  # one language-model worker computes on every usable CPU
    command = [sys.executable, "-m", "bench.studies.decode_split", "--models", name, "--measure"]
    command += ["--variant", config.variant.name]
    command += ["--rounds", str(args.rounds), "--streams", args.streams]
    print(f"[decode] {name}: loading {archive} as a worker does, then {args.rounds} rounds", file=sys.stderr)
    started = time.monotonic()
    environment = child_environment(config, threads, name)
    done = subprocess.run(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        print(
            f"[decode] ERROR: the measuring process failed (exit {done.returncode}); its log is above", file=sys.stderr
        )
        return 1
    print(f"[decode] measured in {time.monotonic() - started:.0f} s", file=sys.stderr)
    splits = [Split(**s) for s in json.loads(done.stdout.strip().splitlines()[-1])]
    out = RESULTS / f"decode-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    study_report(
        out,
        f"Where a decode step goes: {name}",
        f"{args.rounds} rounds of {STEPS} decode steps after a {PROMPT_TOKENS}-token prompt and {MIXED_STEPS} "
        f"steps with a prompt's part, {archive.parent.name}",
        lambda header: table(splits, header),
        {"splits": splits},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
