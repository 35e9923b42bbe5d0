"""Results, references and plans the bench's unit tests share (no server, no ab)."""

from __future__ import annotations

import dataclasses

from bench.payloads import DEFAULT_PAYLOAD
from bench.plan import load_plan
from bench.results import InProcessResult, RowResult, RunEnvironment
from kit.models import Model

ENVIRONMENT = RunEnvironment("cpu", 2, "2.13.0", "0.12.0", "3.11", "abc", "d")


def row_result(**overrides) -> RowResult:
    values = dict(
        model="resnet50",
        name="row",
        kind="served",
        variant="inductor",
        runtime="inductor",
        precompiled=False,
        precision="float32",
        placement="plan",
        objective="throughput",
        cpus="",
        allocator="tcmalloc",
        omp_wait_policy="passive",
        workers=2,
        threads=1,
        batch_size=1,
        max_batch_delay_ms=5,
        concurrency=4,
        baseline=False,
        requests_per_s=20.0,
        items_per_s=20.0,
        mean_ms=200.0,
        p50_ms=190.0,
        p90_ms=220.0,
        p99_ms=250.0,
        max_ms=260.0,
        duration_s=20.0,
        failed=0,
        non_2xx=0,
        complete=400,
        start_to_ready_s=30.0,
        ts_inference_ms=80.0,
        ts_queue_ms=90.0,
        allocator_loaded=["tcmalloc", "tcmalloc"],
        cpu_affinity=[[0], [1]],
        worker_rss_mb=[600.0, 600.0],
        launcher_rss_mb=0.0,
        worker_count=2,
        ab_command="ab -k ...",
    )
    values.update(overrides)
    values.setdefault("payload", DEFAULT_PAYLOAD[Model.load(values["model"]).task.medium])
    return RowResult(**values)


def reference(**overrides) -> InProcessResult:
    values = dict(
        model="resnet50",
        name="openvino int8 b1",
        kind="peer",
        runtime="openvino",
        precision="int8",
        batch_size=1,
        workers=1,
        threads=2,
        items_per_s=100.0,
        cosine_mean=0.9995,
        cosine_min=0.999,
        top1_agreement=1.0,
    )
    values.update(overrides)
    return InProcessResult(**values)


def quick_plan_without_references():
    plan = load_plan("quick")  # baseline, optimized, fixed 2x1 for resnet50 and bert
    return dataclasses.replace(plan, run=dataclasses.replace(plan.run, in_process=False), peers=(), served_peers=())


def fake_rows(monkeypatch, failing: set[tuple[str, str]]):
    """run_row without a server: a result for each row, ServerError for the (model, name) in `failing`."""
    from kit.server import ServerError

    def run_row(row, plan, out_dir, payload):
        if (row.model, row.name) in failing:
            raise ServerError(
                "TorchServe exited during start-up: Unrecognized VM option 'X'; see torchserve.out\n"
                "Error: Could not create the Java Virtual Machine."
            )
        return row_result(model=row.model, name=row.name, baseline=row.baseline)

    monkeypatch.setattr("bench.runner.run_row", run_row)
