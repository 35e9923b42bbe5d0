"""`make bench PLAN=generate MODELS=lm`: a language model served by the kit against what a user would
run instead, streamed, at several concurrencies, in interleaved rounds.

    .venv/bin/python -m bench.generate.run --model lm[,lm-other] [--rounds 3] [--seconds 60] [--concurrency 1,4,16]
        [--peers fastapi,llama.cpp,openvino] [--precisions float32,bfloat16,int8] [--backends inductor,openvino]

Rows, on the model file's own directory, at each precision (bench/generate/systems.py): the kit
(TorchServe: `inductor`; where the CPU computes bf16, `inductor-bf16` and, on int8 weights,
`inductor-bf16-woq`; with --backends openvino also on OpenVINO GenAI's pipeline in the kit's
worker, `openvino`, `openvino-bf16`, `openvino-bf16-woq`); the FastAPI + transformers `generate` peer
(bench/generate/fastapi_peer.py) at the float precisions; llama.cpp's server (bench/generate/llama_cpp.py: built
from PyPI's llama-cpp-python source, the GGUF converted from the same directory; int8 is Q8_0),
with as many parallel slots and as much context per slot as the kit serves; OpenVINO GenAI's
continuous-batching pipeline (bench/generate/openvino_genai.py: exported from the same directory, in an
environment of its own; int8 weights compressed at export), with as many sequences and as much
KV cache. A kit precision whose worker does not start (its accuracy guard refused the model) is
left out, said why. PEERS=none leaves the kit's rows alone. Several model files (the same
directory with other handler settings, e.g. `prefill_chunk`) are each a kit row of their own, in
the same rounds; the peers serve the first one's directory. Every server runs at once;
each round measures every row at every concurrency, in a rotated order, with the same workload
(bench/generate/workloads.py, streams.py): prompts of 20, 80 and 300 of the model's tokens, answers
of 32 and 64, greedy, every answer its full length.
The report gives medians over the rounds and their spread: output tokens/s, time to first token
and inter-token latency (p50, p99), each server's peak PSS and its largest process's, each kit
row against each peer's at its precision, and each row at the most clients against its fewest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.generate.memory import PeakPss
from bench.generate.streams import Ask, StreamStats, measure_streams
from bench.generate.systems import FLOAT32, INDUCTOR, KIT, KIT_VARIANTS, PEERS, System, kit_system, kit_variants, log
from bench.generate.workloads import WORKLOADS, tokenizer_of
from bench.results import RESULTS, RunEnvironment
from bench.studies import steadiness
from kit.models import Model, Task
from kit.paths import ROOT
from kit.server import ServerError
from kit.topology import read_topology

WARMUP_S = 10
# The machine's own speed, idle, this long before the rounds and after them (bench/studies/steadiness.py):
# a shared VM's host can slow it several-fold for seconds, and the report says whether it did.
STEADY_S = 10


def median_stats(runs: list[StreamStats], peaks: list[tuple[int, int]]) -> dict:
    """Medians over the rounds; `peaks`: each round's peak PSS (bytes) and its largest process's."""

    def spread(values: list[float]) -> dict:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    return {
        "output_tokens_per_s": spread([r.output_tokens_per_s for r in runs]),
        "ttft_ms_p50": spread([r.ttft_ms.p50 for r in runs]),
        "ttft_ms_p99": spread([r.ttft_ms.p99 for r in runs]),
        "itl_ms_p50": spread([r.itl_ms.p50 for r in runs]),
        "itl_ms_p99": spread([r.itl_ms.p99 for r in runs]),
        "peak_pss_gb": spread([total / 1e9 for total, _ in peaks]) if any(t for t, _ in peaks) else None,
        # Of that, the largest one process's peak: the kit's worker, a one-process peer's all.
        "largest_process_pss_gb": spread([one / 1e9 for _, one in peaks]) if any(o for _, o in peaks) else None,
        # Each round measures every row: a ratio between rows is taken round by round.
        "output_tokens_per_s_by_round": [r.output_tokens_per_s for r in runs],
        # Of the tokens prompt lookup drafted over the rounds, the share kept; None: it drafted none.
        "drafts_kept": StreamStats.kept_share(sum(r.drafts_kept for r in runs), sum(r.drafts_refused for r in runs)),
        "requests": sum(r.requests for r in runs),
        "errors": sum(r.errors for r in runs),
    }


def ratio(stats: dict, peer: dict | None) -> str:
    """The median of the per-round ratios of output tokens/s, and their spread: hosts drift by
    ±20 % over a run, and a ratio of medians can pair one row's good round with another's bad."""
    if not peer:
        return ""
    # An interrupted run's last round may lack a row: pairs end with the shorter list.
    pairs = zip(stats["output_tokens_per_s_by_round"], peer["output_tokens_per_s_by_round"], strict=False)
    rounds = [ours / theirs for ours, theirs in pairs if theirs]
    if not rounds:
        return ""
    return f"{statistics.median(rounds):.2f}× ({min(rounds):.2f}–{max(rounds):.2f})"


NO_PEERS = "none"  # PEERS=none: the kit's rows alone (several model files, say)


def report(results: dict, systems: dict[str, System], out: Path, header: str) -> str:
    """A row per server and concurrency; each kit row against each peer's row at its precision."""
    peers = [peer for peer in PEERS if any(system.server == peer for system in systems.values())]
    ratios = "".join(f" × {PEERS[peer].title}, by round (min–max) |" for peer in peers)
    lines = [
        header,
        "",
        f"| concurrency | row | output tokens/s (min–max) |{ratios} TTFT p50 ms | ITL p50 ms | ITL p99 ms | drafts kept | peak PSS GB | largest process GB | errors |",
        "|---|---|---|" + "---|" * len(peers) + "---|---|---|---|---|---|---|",
    ]
    for concurrency, rows in results.items():
        for name, stats in rows.items():
            precision = systems[name].precision
            same = {systems[row].server: rows[row] for row in rows if systems[row].precision == precision}
            kit = systems[name].server == KIT
            tps, nothing = stats["output_tokens_per_s"], {"median": float("nan")}
            pss, largest = stats.get("peak_pss_gb") or nothing, stats.get("largest_process_pss_gb") or nothing
            against = "".join(f" {ratio(stats, same.get(peer)) if kit else ''} |" for peer in peers)
            kept = stats.get("drafts_kept")
            drafts = "" if kept is None else f"{kept:.0%}"
            lines.append(
                f"| {concurrency} | {name} | {tps['median']:.1f} ({tps['min']:.1f}–{tps['max']:.1f}) |{against} "
                f"{stats['ttft_ms_p50']['median']:.0f} | {stats['itl_ms_p50']['median']:.0f} | {stats['itl_ms_p99']['median']:.0f} | {drafts} | "
                f"{pss['median']:.2f} | {largest['median']:.2f} | {stats['errors']} |"
            )
    text = "\n".join(lines + scaling(results)) + "\n"
    (out / "report.md").write_text(text)
    return text


def scaling(results: dict) -> list[str]:
    """Each row at the run's most clients against itself at its fewest, in the same run: how much
    more it wrote, how much longer the first token took, how far its slowest tokens lag its
    typical one (what a server that keeps everyone moving holds down)."""
    fewest, most = min(results), max(results)
    rows = [name for name in results[most] if name in results[fewest]]
    if most == fewest or not rows:
        return []
    lines = [
        "",
        f"| row | {most} clients against {fewest}: output tokens/s | TTFT p50 | at {most}: ITL p99 ÷ ITL p50 |",
        "|---|---|---|---|",
    ]
    for name in rows:
        few, many = results[fewest][name], results[most][name]
        if not few["output_tokens_per_s"]["median"]:  # every request failed: nothing to divide by
            lines.append(f"| {name} | – | – | – |")
            continue
        tokens = many["output_tokens_per_s"]["median"] / few["output_tokens_per_s"]["median"]
        ttft = many["ttft_ms_p50"]["median"] / few["ttft_ms_p50"]["median"]
        tail = many["itl_ms_p99"]["median"] / many["itl_ms_p50"]["median"]
        lines.append(f"| {name} | {tokens:.2f}× | {ttft:.2f}× | {tail:.2f}× |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", required=True, help="text-generation model files, comma-separated (make model NAME=... SRC=...)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument(
        "--precisions", default="", help=f"rows of {', '.join(KIT_VARIANTS[INDUCTOR])} (default: each this CPU serves)"
    )
    parser.add_argument(
        "--backends", default=INDUCTOR, help=f"the kit's rows on {', '.join(KIT_VARIANTS)} (each at every precision)"
    )
    parser.add_argument("--peers", default=",".join(PEERS), help=f"of {', '.join(PEERS)}; none: the kit's rows alone")
    parser.add_argument(
        "--workloads", default="text", help=f"of {', '.join(WORKLOADS)}: the kit's rows measure each (peers: text)"
    )
    args = parser.parse_args(argv)
    models = [Model.load(name) for name in args.model.split(",") if name]
    if others := [f"{m.name} ({m.task.value})" for m in models if m.task is not Task.TEXT_GENERATION]:
        log(f"ERROR: PLAN=generate measures text-generation models, not {', '.join(others)}")
        return 2
    model = models[0]  # the peers serve its directory
    tokenizer = tokenizer_of(model)  # the workloads' lengths are in its tokens
    peers = [peer for peer in args.peers.split(",") if peer and peer != NO_PEERS]
    if unknown := sorted(set(peers) - set(PEERS)):
        log(f"ERROR: no peer {unknown}; PEERS= takes {', '.join(PEERS)}")
        return 2
    workloads = [w for w in args.workloads.split(",") if w]
    if unknown := sorted(set(workloads) - set(WORKLOADS)):
        log(f"ERROR: no workload {unknown}; WORKLOADS= takes {', '.join(WORKLOADS)}")
        return 2
    backends = [b for b in args.backends.split(",") if b]
    if unknown := sorted(set(backends) - set(KIT_VARIANTS)):
        log(f"ERROR: no kit backend {unknown}; BACKENDS= takes {', '.join(KIT_VARIANTS)}")
        return 2
    served = kit_variants()
    precisions = [p for p in args.precisions.split(",") if p] if args.precisions else list(served)
    if unserved := [p for p in precisions if p not in served]:
        log(f"ERROR: no kit variant serves {unserved} on this CPU; it serves {', '.join(served)}")
        return 2
    rows = [(kit_variants(backend)[p], p) for backend in backends for p in precisions]
    # The inductor float32 archive is built whatever is measured: the peers take its settings.
    variants = dict.fromkeys([KIT_VARIANTS[INDUCTOR][FLOAT32]] + [variant for variant, _ in rows])
    build = [
        sys.executable,
        "-m",
        "model_store.build",
        "--models",
        ",".join(m.name for m in models),
        "--variants",
        ",".join(variants),
    ]
    if subprocess.run(build, cwd=ROOT).returncode != 0:
        return 1
    out = RESULTS / f"generate-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    systems: list[System] = []
    results: dict[int, dict[str, list[StreamStats]]] = {c: {} for c in concurrencies}
    # Per round: the peak PSS and the largest process's.
    memory: dict[int, dict[str, list[tuple[int, int]]]] = {c: {} for c in concurrencies}
    measured: list[tuple[System, list[Ask]]] = []  # each row: its system and its workload
    idle: list[steadiness.Probe] = []  # the machine's speed before and after the rounds
    try:
        for kit_model in models:
            for variant, precision in rows:
                started_at = time.monotonic()
                try:
                    systems.append(kit_system(kit_model, variant, precision, out, named=len(models) > 1))
                except ServerError as error:
                    # The accuracy guard refused the precision on this model: no row, said why.
                    log(f"kit {variant} for {kit_model.name} did not start, left out: {error}")
                    continue
                log(f"{systems[-1].name}: its worker started in {time.monotonic() - started_at:.0f} s")
        for peer in peers:
            for precision in [p for p in precisions if p in PEERS[peer].precisions]:
                log(f"starting {peer} at {precision}")
                systems.append(PEERS[peer].start(model, precision, out))
        # A row per system and workload: the kit's rows at each workload asked, the peers' at text.
        measured += [
            (
                system if kind == "text" else dataclasses.replace(system, name=f"{system.name} {kind}"),
                WORKLOADS[kind](tokenizer),
            )
            for system in systems
            for kind in (workloads if system.server == KIT else ["text"])
        ]
        for system, asks in measured:
            log(f"warming up {system.name}")
            measure_streams(system.url, system.model, asks, 2, WARMUP_S)
        idle = steadiness.measure(STEADY_S, 0.5, read_topology().capacity)
        for round_ in range(args.rounds):
            order = measured[round_ % len(measured) :] + measured[: round_ % len(measured)]
            for concurrency in concurrencies:
                for system, asks in order:
                    with PeakPss(system.pids) as peak:
                        stats = measure_streams(system.url, system.model, asks, concurrency, args.seconds)
                    results[concurrency].setdefault(system.name, []).append(stats)
                    memory[concurrency].setdefault(system.name, []).append((peak.bytes, peak.largest))
                    log(f"round {round_ + 1}/{args.rounds} c={concurrency} {system.name}: {stats.summary()}")
    except KeyboardInterrupt:
        log("interrupted: the report has the rows measured so far")
    finally:
        for system in systems:
            system.stop()
    if idle:
        after = steadiness.measure(STEADY_S, 0.5, read_topology().capacity)
        idle = [steadiness.Probe(b.name, b.ms + a.ms) for b, a in zip(idle, after, strict=True)]
    summary = {
        c: {name: median_stats(runs, memory[c][name]) for name, runs in rows.items()}
        for c, rows in results.items()
        if rows
    }
    by_name = {system.name: system for system, _ in measured}
    topology = read_topology()
    header = (
        f"# PLAN=generate: {', '.join(m.name for m in models)} ({model.source.location})\n\n`{' '.join(sys.argv)}` at "
        f"{RunEnvironment.capture().git_commit}; {args.rounds} rounds of {args.seconds:.0f} s per row and concurrency; "
        f"CPU: {topology.model_name} ({len(topology.cpus)} CPUs usable)."
    )
    if idle:
        header += (
            f"\n\nThe machine idle, {STEADY_S} s before the rounds and {STEADY_S} s after: {steadiness.brief(idle)}"
        )
    (out / "results.json").write_text(
        json.dumps(
            {
                "command": sys.argv,
                "rows": {s.name: {"server": s.server, "precision": s.precision} for s in by_name.values()},
                "summary": summary,
                "steadiness": [dataclasses.asdict(p) for p in idle],
            },
            indent=2,
        )
    )
    print(report(summary, by_name, out, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
