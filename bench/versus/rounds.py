"""The kit against the servers a user would write instead, in interleaved rounds (a plan with `rounds:`).

    make bench PLAN=versus [MODELS=mine]              # bench/plans/versus.yaml
    .venv/bin/python -m bench --plan versus --models mine

Runs of one configuration differ by ±20 % between fresh processes on these hosts: one measurement
of each side is no comparison. Every round runs each of the plan's kit rows and served peers once,
in the plan's order on even rounds and reversed on odd ones (a drift over the run falls on both
sides alike); bench/versus/report.py gives each one's median and spread over the rounds and says
ahead or behind only where every round of one side beat every round of the other. No in-process
rows and no in-process peers: those are the default plan's.
"""

from __future__ import annotations

import dataclasses
import functools
import signal
from collections.abc import Callable
from pathlib import Path

from bench.payloads import write_payload
from bench.plan import Plan, Row, ServedPeer, row_payload
from bench.results import BenchRun, RowFailure, RowResult
from bench.runner import _raise_interrupt, log, missing_environment, record, row_dir, run_row, skip
from bench.versus.served import peer_log, row_name, run_served_peer
from kit.models import Model
from kit.variant import Variant


@dataclasses.dataclass(frozen=True)
class Entry:
    """One side of the comparison, measured once per round."""

    label: str
    failure: RowFailure  # what a failed measurement is recorded as (reason and log filled in then)
    measure: Callable[[Path], RowResult]  # the round's directory -> a result
    log: Callable[[Path], Path]  # the round's directory -> where the measurement's server logs


def kit_entry(row: Row, plan: Plan) -> Entry:
    def measure(out_dir: Path) -> RowResult:
        return run_row(row, plan, out_dir, write_payload(row.payload, Model.load(row.model), out_dir / "payloads"))

    failure = RowFailure(row.model, row.name, "served", row.baseline, "", "")
    return Entry(row.label, failure, measure, lambda round_dir: row_dir(round_dir, row))


def peer_entry(peer: ServedPeer, model: str, plan: Plan) -> Entry:
    name = row_payload(f"served peer {peer.name}", model, peer.payload)

    def measure(out_dir: Path) -> RowResult:
        payload = write_payload(name, Model.load(model), out_dir / "payloads")
        return run_served_peer(peer, model, payload, plan.run, out_dir)

    failure = RowFailure(model, row_name(peer, plan.run), "served_peer", False, "", "")
    log = lambda round_dir: peer_log(peer, model, plan.run, round_dir)  # noqa: E731
    return Entry(f"{model} / {row_name(peer, plan.run)}", failure, measure, log)


def entries(run: BenchRun) -> list[Entry]:
    """Every kit row and served peer this machine can run, models in the plan's order."""
    plan, out = run.plan, []
    for model in plan.run.models:
        for row in (r for r in plan.rows if r.model == model):
            if reason := missing_environment(row):
                skip(run, row.label, reason)
            else:
                out.append(kit_entry(row, plan))
        for peer in plan.served_peers:
            if refusal := Variant.load(peer.variant).refusal():
                skip(run, f"served peer {model} / {peer.name}", refusal)
            else:
                out.append(peer_entry(peer, model, plan))
    return out


def run_rounds(run: BenchRun, out_dir: Path) -> None:
    """run.results gets one RowResult per entry and round (its `round` set), failures run.failed."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # `kill` stops cleanly like Ctrl-C
    plan = run.plan
    try:
        todo = entries(run)
        for number in range(plan.run.rounds):
            order = todo if number % 2 == 0 else todo[::-1]
            round_dir = out_dir / f"round-{number + 1}"
            for index, entry in enumerate(order, start=1):
                log(
                    f"[round {number + 1}/{plan.run.rounds}, {index}/{len(order)}] {entry.label}: "
                    f"start, warm up, ab {plan.run.seconds}s"
                )
                failure = dataclasses.replace(entry.failure, log=str(entry.log(round_dir)))
                before = len(run.results)
                record(run, failure, functools.partial(entry.measure, round_dir))
                for result in run.results[before:]:
                    result.round = number + 1
    finally:
        signal.signal(signal.SIGTERM, previous)
