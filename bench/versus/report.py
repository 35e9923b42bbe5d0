"""The interleaved rounds of bench/versus/rounds.py as medians, spreads and verdicts: report.md and results.json.

    summaries = summarize_entries(run.results)     # one per kit row or peer, over its rounds
    verdicts = compare(summaries)                  # per model and concurrency: best kit vs best peer
    write_versus_report(out_dir, run)

A verdict says `ahead` (or `behind`) only when every round of one side was faster than every round
of the other; overlapping spreads are `level`, whatever the medians' ratio.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
from pathlib import Path

from bench.cpu_accounting import FRONTEND, FRONTEND_JIT, LOAD_GENERATOR
from bench.results import BenchRun, RowResult
from bench.versus.served import PEER_GROUP
from handlers.stages import WORK


@dataclasses.dataclass(frozen=True)
class EntrySummary:
    model: str
    name: str
    kind: str  # served (the kit) | served_peer
    precision: str
    batch_size: int
    concurrency: int
    rounds: int
    requests_per_s: float  # median over the rounds
    requests_per_s_min: float
    requests_per_s_max: float
    p50_ms: float  # medians
    p99_ms: float
    cpu_ms_per_request: dict[str, float]  # process group -> median
    stage_ms_per_request: dict[str, float]  # stage -> median wall ms (handlers/stages.py; peers time theirs too)
    stage_cpu_ms_per_request: dict[str, float]  # stage -> median CPU ms
    itt: bool  # its workers recorded ITT ranges: a measurement of the trace's cost, not a contender

    @property
    def spread(self) -> float:
        """(max - min) / median: how far apart the rounds were."""
        return (self.requests_per_s_max - self.requests_per_s_min) / self.requests_per_s if self.requests_per_s else 0.0


@dataclasses.dataclass(frozen=True)
class Verdict:
    model: str
    precision: str
    concurrency: int
    kit: str  # the best kit row (by median)
    peer: str  # the best peer
    ratio: float  # kit median / peer median
    verdict: str  # ahead | level | behind


def median_of(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def medians_by_key(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({key for d in dicts for key in d})
    return {key: median_of([d[key] for d in dicts if key in d]) for key in keys}


def summarize_entry(results: list[RowResult]) -> EntrySummary:
    first = results[0]
    speeds = [r.requests_per_s for r in results]
    return EntrySummary(
        model=first.model,
        name=first.name,
        kind=first.kind,
        precision=first.precision,
        batch_size=first.batch_size,
        concurrency=first.concurrency,
        rounds=len(results),
        requests_per_s=median_of(speeds),
        requests_per_s_min=min(speeds),
        requests_per_s_max=max(speeds),
        p50_ms=median_of([r.p50_ms for r in results]),
        p99_ms=median_of([r.p99_ms for r in results]),
        cpu_ms_per_request=medians_by_key([r.cpu_ms_per_request for r in results]),
        stage_ms_per_request=medians_by_key(
            [{stage: s["ms_per_request"] for stage, s in r.stages.items()} for r in results]
        ),
        stage_cpu_ms_per_request=medians_by_key(
            [{stage: s.get("cpu_ms_per_request", 0.0) for stage, s in r.stages.items()} for r in results]
        ),
        itt=first.itt_ranges is not None,
    )


@dataclasses.dataclass(frozen=True)
class OutsideModel:
    """One entry's CPU per request outside the model call: what serving costs beside the model.
    The model stage holds the same IR run the same way on both sides (collate + infer)."""

    model_call: float
    decode: float
    serving_process: float  # the kit's workers / the peer's processes, outside the model call
    frontend: float  # the kit's TorchServe frontend (its JIT included); 0 for a peer
    total: float  # everything the row ran but ab, outside the model call


SERVING_PROCESS = {"served": "workers", "served_peer": PEER_GROUP}


def outside_model(s: EntrySummary) -> OutsideModel | None:
    """None when the entry has no stage times (TorchServe's own worker) or no CPU accounting."""
    model_call = s.stage_cpu_ms_per_request.get("model")
    process = s.cpu_ms_per_request.get(SERVING_PROCESS[s.kind])
    if not model_call or process is None:
        return None
    frontend = s.cpu_ms_per_request.get(FRONTEND, 0.0) + s.cpu_ms_per_request.get(FRONTEND_JIT, 0.0)
    everything = sum(ms for group, ms in s.cpu_ms_per_request.items() if group != LOAD_GENERATOR)
    return OutsideModel(
        round(model_call, 2),
        round(s.stage_cpu_ms_per_request.get("decode", 0.0), 2),
        round(process - model_call, 2),
        round(frontend, 2),
        round(everything - model_call, 2),
    )


def summarize_entries(results: list[RowResult]) -> list[EntrySummary]:
    """One summary per (model, name), in the order first measured."""
    groups: dict[tuple[str, str], list[RowResult]] = {}
    for result in results:
        groups.setdefault((result.model, result.name), []).append(result)
    return [summarize_entry(group) for group in groups.values()]


def verdict(kit: EntrySummary, peer: EntrySummary) -> str:
    if kit.requests_per_s_min > peer.requests_per_s_max:
        return "ahead"
    if kit.requests_per_s_max < peer.requests_per_s_min:
        return "behind"
    return "level"


def compare(summaries: list[EntrySummary]) -> list[Verdict]:
    """Per model, precision and concurrency with both sides measured: the best kit row (as `make
    serve` runs it: no ITT collector) against the best peer."""
    verdicts = []
    key = lambda s: (s.model, s.precision, s.concurrency)  # noqa: E731
    for (model, precision, concurrency), group in itertools.groupby(sorted(summaries, key=key), key=key):
        group = list(group)
        kits = [s for s in group if s.kind == "served" and not s.itt]
        peers = [s for s in group if s.kind == "served_peer"]
        if not kits or not peers:
            continue
        kit = max(kits, key=lambda s: s.requests_per_s)
        peer = max(peers, key=lambda s: s.requests_per_s)
        ratio = round(kit.requests_per_s / peer.requests_per_s, 2) if peer.requests_per_s else 0.0
        verdicts.append(Verdict(model, precision, concurrency, kit.name, peer.name, ratio, verdict(kit, peer)))
    return verdicts


def markdown(run: BenchRun, summaries: list[EntrySummary], verdicts: list[Verdict]) -> str:
    env = run.environment
    lines = [
        f"# The kit against the servers a user would write: plan `{run.plan.name}`, {run.plan.run.rounds} "
        "interleaved rounds",
        "",
        f"`{run.command}` at commit {env.git_commit}, {env.date}; CPU: {env.cpu_model}, {env.cores} CPUs; "
        f"torch {env.torch}, TorchServe {env.torchserve}; ab for {run.plan.run.seconds} s per measurement.",
        "",
        "| model | side | name | c | req/s median | min–max (spread) | p50 ms | p99 ms | CPU ms/request |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        cpu = ", ".join(f"{group} {ms}" for group, ms in s.cpu_ms_per_request.items() if ms)
        lines.append(
            f"| {s.model} | {side_of(s)} | {s.name} | {s.concurrency} | {s.requests_per_s} | {s.requests_per_s_min}–"
            f"{s.requests_per_s_max} ({s.spread:.0%}) | {s.p50_ms} | {s.p99_ms} | {cpu} |"
        )
    lines += stage_lines(summaries) + outside_model_lines(summaries)
    lines += [
        "",
        "Best kit row against the best peer, per model, precision and concurrency (ahead / behind "
        "only when every round of one beat every round of the other):",
        "",
        "| model | precision | c | kit | peer | kit / peer (medians) | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {v.model} | {v.precision} | {v.concurrency} | {v.kit} | {v.peer} | {v.ratio:.2f}× | {v.verdict} |"
        for v in verdicts
    ]
    if run.skipped:
        lines += ["", "Skipped:", *[f"- {reason}" for reason in run.skipped]]
    if run.failed:
        lines += ["", "Failed:", *[f"- {f.model} / {f.name}: {f.reason} (log: {f.log})" for f in run.failed]]
    return "\n".join(lines) + "\n"


def stage_lines(summaries: list[EntrySummary]) -> list[str]:
    staged = [s for s in summaries if s.stage_ms_per_request]
    if not staged:
        return []
    stages = list(dict.fromkeys(stage for s in staged for stage in s.stage_ms_per_request))
    lines = [
        "",
        "Where a request's time goes, per stage (handlers/stages.py; the peers time their decode, model "
        "call and format the same way): median wall ms / CPU ms per request over the rounds; `all` leaves "
        "out `wait`, the idle time before a call:",
        "",
        f"| model | side | name | {' | '.join(stages)} | all |",
        f"|---|---|---|{'---|' * (len(stages) + 1)}",
    ]
    for s in staged:
        cells = [
            f"{s.stage_ms_per_request.get(stage, 0.0):.2f} / {s.stage_cpu_ms_per_request.get(stage, 0.0):.2f}"
            if stage in s.stage_ms_per_request
            else "–"
            for stage in stages
        ]
        wall = sum(ms for stage, ms in s.stage_ms_per_request.items() if stage in WORK)
        cpu = sum(ms for stage, ms in s.stage_cpu_ms_per_request.items() if stage in WORK)
        lines.append(f"| {s.model} | {side_of(s)} | {s.name} | {' | '.join(cells)} | {wall:.2f} / {cpu:.2f} |")
    return lines


def outside_model_lines(summaries: list[EntrySummary]) -> list[str]:
    measured = [(s, o) for s in summaries if (o := outside_model(s))]
    if not measured:
        return []
    lines = [
        "",
        "CPU per request outside the model call (median ms; the model call's CPU from its stage, the "
        "processes' from /proc): the kit's workers against the peer's processes, then everything but ab:",
        "",
        "| model | side | name | model call | decode | workers / app outside the model | frontend | "
        "all outside the model |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {s.model} | {side_of(s)} | {s.name} | {o.model_call:.2f} | {o.decode:.2f} | {o.serving_process:.2f} | "
        f"{o.frontend:.2f} | {o.total:.2f} |"
        for s, o in measured
    ]
    return lines


def side_of(summary: EntrySummary) -> str:
    return "kit" if summary.kind == "served" else "peer"


def write_versus_report(out_dir: Path, run: BenchRun) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = summarize_entries(run.results)
    verdicts = compare(summaries)
    document = {
        "plan": run.plan.name,
        "command": run.command,
        "environment": dataclasses.asdict(run.environment),
        "summaries": [dataclasses.asdict(s) for s in summaries],
        "outside_model": {f"{s.model}/{s.name}": dataclasses.asdict(o) for s in summaries if (o := outside_model(s))},
        "verdicts": [dataclasses.asdict(v) for v in verdicts],
        "rows": [dataclasses.asdict(r) for r in run.results],
        "skipped": list(run.skipped),
        "failed": [dataclasses.asdict(f) for f in run.failed],
    }
    (out_dir / "results.json").write_text(json.dumps(document, indent=2))
    (out_dir / "report.md").write_text(markdown(run, summaries, verdicts))
    latest = out_dir.parent / "latest"
    latest.unlink(missing_ok=True)
    latest.symlink_to(out_dir.name)
