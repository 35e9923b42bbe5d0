"""kit/pin_worker.py in a real process: each model's worker gets its planned CPUs and its own
allocator (a server may serve an OpenVINO model, which must keep glibc malloc, beside an
Inductor one on tcmalloc). The worker here is a shell script reporting what it was given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from handlers.switches import PLANNED_KV_CONTEXTS_VAR, PLANNED_SEQUENCES_VAR, planned_kv_contexts, planned_sequences
from kit import pin_worker

REPORT = """#!/bin/sh
echo "allocator=$(grep -q libtcmalloc /proc/$$/maps && echo tcmalloc || echo default)"
echo "cpus=$(grep Cpus_allowed_list /proc/$$/status | cut -f2)"
echo "omp=$OMP_NUM_THREADS"
echo "sequences=${KIT_MAX_SEQUENCES:-unset}"
echo "kv_contexts=${KIT_KV_CONTEXTS:-unset}"
echo "policy=$(numactl --show | sed -n 's/^policy: //p')"
echo "omp_wait=${OMP_WAIT_POLICY:-unset}"
echo "args=$*"
"""


def start_worker(
    tmp_path: Path, model: str, layout: dict, args: tuple[str, ...] = ("--sock-type", "unix"), kit_worker: bool = False
) -> dict[str, str]:
    tmp_path.mkdir()
    (tmp_path / "layout.json").write_text(json.dumps(layout))
    worker_dir = tmp_path / model / "MAR-INF"
    worker_dir.mkdir(parents=True)
    (worker_dir / "MANIFEST.json").write_text(json.dumps({"model": {"modelName": model}}))
    if kit_worker:  # an archive the kit built carries handlers/worker.py
        (tmp_path / model / pin_worker.KIT_WORKER_FILE).parent.mkdir()
        (tmp_path / model / pin_worker.KIT_WORKER_FILE).write_text("")
    script = tmp_path / "report.sh"
    script.write_text(REPORT)
    script.chmod(0o755)
    env = dict(
        os.environ,
        **{
            pin_worker.LAYOUT_VAR: str(tmp_path / "layout.json"),
            pin_worker.PYTHON_VAR: str(script),
            pin_worker.ALLOCATOR_DIR_VAR: str(Path(sys.prefix) / "lib"),
        },  # make install links the allocators there
    )
    env.pop("LD_PRELOAD", None)
    out = subprocess.run(
        [sys.executable, pin_worker.__file__, *args],
        cwd=worker_dir.parent,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_each_model_gets_its_planned_cpus_and_allocator(tmp_path):
    cpu = max(os.sched_getaffinity(0))
    worker = {"cpus": [cpu], "threads": 1, "numa_node": 0}
    layout = {
        "models": {
            "resnet50": {"workers": [worker], "allocator": "tcmalloc", "batch_size": 1},
            "bert": {"workers": [worker], "allocator": "default", "batch_size": 1},
        }
    }
    resnet50 = start_worker(tmp_path / "a", "resnet50", layout)
    assert resnet50["allocator"] == "tcmalloc" and resnet50["cpus"] == str(cpu)
    assert resnet50["omp"] == "1" and resnet50["args"] == "--sock-type unix"  # the worker's own arguments passed on
    bert = start_worker(tmp_path / "b", "bert", layout)
    assert bert["allocator"] == "default" and bert["cpus"] == str(cpu)


def test_a_worker_over_several_nodes_has_its_memory_interleaved_one_on_a_node_bound(tmp_path):
    from kit.layout import INTERLEAVED

    assert pin_worker.INTERLEAVED == INTERLEAVED  # spelled in both: this script imports nothing of the kit
    cpu = max(os.sched_getaffinity(0))
    for name, node, policy in (("one", 0, "bind"), ("spanning", INTERLEAVED, "interleave")):
        layout = {
            "models": {"lm": {"workers": [{"cpus": [cpu], "threads": 1, "numa_node": node}], "allocator": "default"}}
        }
        assert start_worker(tmp_path / name, "lm", layout)["policy"] == policy  # read by numactl in the worker


def test_a_model_with_its_own_openmp_wait_policy_gets_it_over_the_servers(tmp_path, monkeypatch):
    from kit.layout import OmpWaitPolicy

    assert OmpWaitPolicy.DEFAULT.value == pin_worker.LIBGOMP_DEFAULT  # spelled in both
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the preset's, for every worker (kit/serve_config.py)
    cpu = max(os.sched_getaffinity(0))
    worker = {"cpus": [cpu], "threads": 1, "numa_node": 0}
    layout = {
        "models": {
            "lm": {"workers": [worker], "allocator": "default", "omp_wait_policy": "default"},  # libgomp's: unset
            "spinner": {"workers": [worker], "allocator": "default", "omp_wait_policy": "active"},
            "bert": {"workers": [worker], "allocator": "default", "omp_wait_policy": ""},
        }
    }
    assert start_worker(tmp_path / "a", "lm", layout)["omp_wait"] == "unset"
    assert start_worker(tmp_path / "b", "spinner", layout)["omp_wait"] == "ACTIVE"
    assert start_worker(tmp_path / "c", "bert", layout)["omp_wait"] == "PASSIVE"


def test_glibc_malloc_is_spelled_as_the_allocator_enum_spells_it(tmp_path):
    from kit.layout import Allocator

    assert Allocator.DEFAULT.value == pin_worker.GLIBC_MALLOC
    assert pin_worker.allocator_library(tmp_path, Allocator.DEFAULT.value) is None
    assert pin_worker.allocator_library(tmp_path, Allocator.JEMALLOC.value) == tmp_path / "libjemalloc.so"


def test_the_kits_worker_replaces_torchserves_when_the_archive_carries_it(tmp_path):
    cpu = max(os.sched_getaffinity(0))
    layout = {"models": {"m": {"workers": [{"cpus": [cpu], "threads": 1, "numa_node": 0}], "allocator": "default"}}}
    ts_worker = ("/venv/lib/python3.11/site-packages/ts/model_service_worker.py", "--sock-type", "unix")
    ours = start_worker(tmp_path / "a", "m", layout, ts_worker, kit_worker=True)
    assert ours["args"] == "-m handlers.worker --sock-type unix"
    theirs = start_worker(tmp_path / "b", "m", layout, ts_worker)  # an archive built elsewhere: TorchServe's
    assert theirs["args"] == " ".join(ts_worker)


def test_both_workers_are_recognised_by_their_command_line():
    assert pin_worker.is_worker(["python", "/x/ts/model_service_worker.py", "--sock-type", "unix"])
    assert pin_worker.is_worker(["python", "-m", "handlers.worker", "--sock-type", "unix"])
    assert not pin_worker.is_worker(["python", "-m", "kit", "serve"])


def test_a_language_models_worker_is_told_its_planned_sequences_and_kv_contexts(tmp_path):
    assert pin_worker.SEQUENCES_VAR == PLANNED_SEQUENCES_VAR  # one name, spelled in two places
    assert pin_worker.KV_CONTEXTS_VAR == PLANNED_KV_CONTEXTS_VAR
    cpu = max(os.sched_getaffinity(0))
    worker = {"cpus": [cpu], "threads": 1, "numa_node": 0}
    layout = {
        "models": {
            "lm": {"workers": [worker], "allocator": "default", "sequences": 3, "kv_contexts": 2},
            "bert": {"workers": [worker], "allocator": "default", "sequences": 0, "kv_contexts": 0},
        }
    }
    told = start_worker(tmp_path / "a", "lm", layout)
    assert (told["sequences"], told["kv_contexts"]) == ("3", "2")
    told = start_worker(tmp_path / "b", "bert", layout)
    assert (told["sequences"], told["kv_contexts"]) == ("unset", "unset")
    assert planned_sequences({PLANNED_SEQUENCES_VAR: "3"}) == 3 and planned_sequences({}) is None
    assert planned_kv_contexts({PLANNED_KV_CONTEXTS_VAR: "2"}) == 2 and planned_kv_contexts({}) is None
    with pytest.raises(ValueError, match="KIT_KV_CONTEXTS must be a number of contexts >= 1, got '0'"):
        planned_kv_contexts({PLANNED_KV_CONTEXTS_VAR: "0"})
