"""bench/plan.py: plans validated and expanded, each error naming the problem."""

from __future__ import annotations

import pytest
import yaml

from bench.plan import PLANS, Peer, PlanError, Runtime, load_plan, parse_plan
from handlers.backends import DType
from kit.topology import parse_topology
from tests.machines import FIXTURES


def test_bundled_plans_are_valid():
    # Every plan loads; those comparing against TorchServe out of the box have one baseline per model.
    from bench.plan import GENERATE, PLANS, read_plan

    with_baseline = {"quick", "default", "full", "tune", "placement", "backends"}
    names = {p.stem for p in PLANS.glob("*.yaml")}
    assert with_baseline | {"frontend", "phone"} <= names
    serving = {name for name in names if read_plan(name)[1].get("kind") != GENERATE}
    assert names - serving == {"generate", "generate-lookup", "generate-structured"}
    for name in serving:
        plan = load_plan(name)
        assert plan.rows, name
        if name in with_baseline:
            for model in {r.model for r in plan.rows}:
                assert sum(r.baseline for r in plan.rows if r.model == model) == 1, f"{name}: one baseline per model"


def test_a_plan_names_the_archives_it_needs():
    plan = load_plan("default")
    # Row variants for the models that run them; eager for the peers' weights and the baseline.
    assert plan.archives["aoti-int8"] == ["resnet50", "bert"]
    assert plan.archives["eager"] == ["resnet50", "bert"]
    assert set(plan.archives) == {
        "eager",
        "inductor",
        "inductor-mkl",
        "inductor-bf16",
        "openvino",
        "openvino-bf16",
        "aoti-int8",
        "openvino-int8",
        "ipex",
        "ipex-bf16",
    }
    assert plan.archives["inductor-mkl"] == ["bert"]
    tiny = parse_plan("t", {"models": ["minilm"], "rows": [{"name": "x", "preset": "optimized", "variant": "aoti"}]})
    assert tiny.archives == {"aoti": ["minilm"]}  # no peers: no eager archive needed


def test_matrix_expands_with_named_rows():
    plan = parse_plan(
        "t",
        {
            "models": ["resnet50"],
            "rows": [
                {
                    "name": "layout",
                    "preset": "fixed-2x1",
                    "allocator": ["jemalloc", "tcmalloc"],
                    "workers": [1, 2],
                    "threads": 1,
                },
            ],
        },
    )
    assert [r.name for r in plan.rows] == [
        "layout allocator=jemalloc workers=1",
        "layout allocator=jemalloc workers=2",
        "layout allocator=tcmalloc workers=1",
        "layout allocator=tcmalloc workers=2",
    ]
    assert plan.rows[3].serve.allocator.value == "tcmalloc" and plan.rows[3].serve.workers == 2


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"rows": [{"name": "x", "alocator": "tcmalloc"}]}, r"row 1 \('x'\): unknown key\(s\) \['alocator'\]"),
        ({"rows": [{"preset": "optimized"}]}, "every row needs a name"),
        ({"rows": [{"name": "x", "allocator": "mimalloc"}]}, "allocator 'mimalloc' is unknown"),
        ({"rows": [{"name": "x", "inference_port": 80}]}, "chosen by the bench"),
        ({"secs": 5, "rows": [{"name": "x"}]}, r"unknown setting\(s\) \['secs'\]"),
        ({"rows": []}, "has no rows"),
        ({"rows": [{"name": "a", "baseline": True}, {"name": "b", "baseline": True}]}, "several baseline rows"),
        (
            {"models": ["bert"], "rows": [{"name": "a"}, {"name": "a", "payload": "short"}]},
            r"several rows are labelled \['bert / a'\]; give each its own name",
        ),
    ],
)
def test_plan_errors_name_the_problem(raw, message):
    with pytest.raises(PlanError, match=message):
        parse_plan("t", raw)


def test_unknown_plan_lists_choices():
    with pytest.raises(
        PlanError,
        match="plan 'fast' not found; choose one of: backends, batching, default, frontend, full, generate, generate-lookup, generate-structured, lengths, metrics, phone, placement, quick, served, tune",
    ):
        load_plan("fast")


def test_plan_peers_are_parsed_and_checked():
    plan = parse_plan("t", {"rows": [{"name": "x"}], "peers": [{"runtime": "openvino", "precision": "int8"}]})
    assert plan.peers == (Peer(Runtime.OPENVINO, DType.INT8),)
    with pytest.raises(PlanError, match="runtime 'tensorrt' is unknown; choose one of: onnxruntime, openvino"):
        parse_plan("t", {"rows": [{"name": "x"}], "peers": [{"runtime": "tensorrt"}]})


def test_rows_name_their_payload_and_it_fits_the_model():
    plan = parse_plan("p", {"models": ["resnet50", "bert"], "rows": [{"name": "opt"}]})
    assert {(r.model, r.payload) for r in plan.rows} == {("resnet50", "vga"), ("bert", "typical")}
    plan = parse_plan("p", {"rows": [{"name": "photos", "models": ["resnet50"], "payload": ["thumbnail", "phone"]}]})
    assert [(r.name, r.payload) for r in plan.rows] == [
        ("photos payload=thumbnail", "thumbnail"),
        ("photos payload=phone", "phone"),
    ]
    with pytest.raises(
        PlanError, match=r"payload 'phone' does not fit bert \(text\); use one of \['long', 'short', 'typical'\]"
    ):
        parse_plan("p", {"rows": [{"name": "x", "models": ["bert"], "payload": "phone"}]})
    with pytest.raises(PlanError, match="unknown payload 'huge'; choose one of"):
        parse_plan("p", {"rows": [{"name": "x", "models": ["resnet50"], "payload": "huge"}]})


def test_tune_searches_cores_per_worker_up_to_the_machines_l3_domain():
    epyc = parse_topology((FIXTURES / "epyc-96c-12ccd-smt.txt").read_text())
    plan = parse_plan("tune", yaml.safe_load((PLANS / "tune.yaml").read_text()), epyc)
    names = sorted({row.name for row in plan.rows if row.name.startswith("plan cores per worker")})
    assert names == [f"plan cores per worker threads={n}" for n in (2, 4, 8)]
    assert {row.serve.threads for row in plan.rows if row.name in names} == {2, 4, 8}
