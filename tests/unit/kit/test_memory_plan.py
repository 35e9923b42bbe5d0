"""Memory in the plan: footprints measured from /proc, recorded beside archives, and layouts that
fit a budget on the machine classes of tests/machines.py (injected topologies)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
from pathlib import Path

import pytest

from handlers.archive_files import MANIFEST
from kit.footprint import Footprint, footprint_file, measure, record, recorded
from kit.layout import Demand, Grouping, Layout, OmpWaitPolicy, PlanError, Sequences
from kit.plan import place, plan_layout
from kit.properties import COMMON_POOL, common_pool_threads, jvm_args
from kit.serve_config import ConfigError, ServeConfig
from kit.topology import Memory, TopologyError, kb_fields, meminfo_bytes
from tests.machines import FIXTURES, MACHINES, machine

GiB, MiB = 2**30, 2**20
# What warmed workers held here (make serve, 2-core AMD EPYC): Inductor BERT ~1.3 GB, ResNet-50
# and MiniLM ~0.7 GB, of which ~120 MB libraries shared between workers.
INDUCTOR = {
    "bert": Footprint(rss=1340 * MiB, pss=1250 * MiB, private=1220 * MiB, peak=1340 * MiB, workers=2),
    "resnet50": Footprint(rss=740 * MiB, pss=650 * MiB, private=620 * MiB, peak=760 * MiB, workers=2),
    "minilm": Footprint(rss=700 * MiB, pss=600 * MiB, private=580 * MiB, peak=700 * MiB, workers=2),
}


def demands(footprints: dict[str, Footprint | None] = INDUCTOR) -> list[Demand]:
    return [Demand(model, footprint=footprint) for model, footprint in footprints.items()]


def with_budget(topology, budget: int):
    return dataclasses.replace(topology, memory=Memory(budget, budget, limit=budget))


def shape(layout: Layout) -> dict[str, tuple[int, int]]:
    return {name: (len(m.workers), max(w.threads for w in m.workers)) for name, m in layout.models.items()}


# -- footprints -------------------------------------------------------------------------------
ROLLUP = """55d0a0000000-7ffd1b7e5000 ---p 00000000 00:00 0                          [rollup]
Rss:              625088 kB
Pss:              467501 kB
Shared_Clean:     140948 kB
Shared_Dirty:     107508 kB
Private_Clean:        44 kB
Private_Dirty:    376588 kB
"""


def test_a_footprint_is_read_from_smaps_rollup_and_costs_shared_pages_once():
    fields = kb_fields(ROLLUP)
    assert (fields["Rss"], fields["Private_Dirty"]) == (625088 * 1024, 376588 * 1024)
    footprint = Footprint(
        fields["Rss"], fields["Pss"], fields["Private_Clean"] + fields["Private_Dirty"], peak=700000 * 1024
    )
    assert footprint.shared == (140948 + 107508) * 1024
    # One more worker adds its private pages and what it held above them while warming up.
    assert footprint.per_worker == (44 + 376588 + 700000 - 625088) * 1024
    assert footprint.cost(3) == 3 * footprint.per_worker + footprint.shared
    assert footprint.cost(1) == footprint.peak  # alone: what it peaked at


def test_this_process_is_measured_from_proc():
    footprint = measure(os.getpid())
    assert 0 < footprint.private <= footprint.pss <= footprint.rss <= footprint.peak


def built_archive(directory: Path, created: str) -> Path:
    """An archive's directory as torch-model-archiver writes it: a manifest stamped when it was built."""
    (directory / MANIFEST).parent.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST).write_text(json.dumps({"createdOn": created, "model": {"modelName": directory.name}}))
    return directory


def test_a_recorded_footprint_is_stale_once_the_archive_is_rebuilt(tmp_path):
    archive = built_archive(tmp_path / "bert", created="02/12/2026 10:00:00")
    assert recorded(archive, 1) is None  # never measured
    worst = record(archive, 1, [INDUCTOR["bert"], dataclasses.replace(INDUCTOR["bert"], rss=1400 * MiB)])
    assert footprint_file(archive, 1).name == "bert.footprint.json"
    assert recorded(archive, 1) == worst == dataclasses.replace(INDUCTOR["bert"], rss=1400 * MiB, workers=2)
    copy = tmp_path / "image" / "bert"  # the archive and its footprint copied into an image
    shutil.copytree(archive, copy)
    shutil.copyfile(footprint_file(archive, 1), footprint_file(copy, 1))
    assert recorded(copy, 1) == worst
    built_archive(archive, created="02/12/2026 10:05:00")  # `make archive` wrote a new one
    assert recorded(archive, 1) is None
    footprint_file(archive, 1).write_text("{not json")
    assert recorded(archive, 1) is None


def test_a_footprint_holds_for_the_batch_size_it_was_measured_at(tmp_path):
    archive = built_archive(tmp_path / "bert", created="02/12/2026 10:00:00")
    single = record(archive, 1, [INDUCTOR["bert"]])
    assert recorded(archive, 4) is None  # a batching worker holds more: measured again
    batching = record(archive, 4, [dataclasses.replace(INDUCTOR["bert"], private=INDUCTOR["bert"].private + 330 * MiB)])
    assert footprint_file(archive, 4).name == "bert.b4.footprint.json"
    assert recorded(archive, 1) == single and recorded(archive, 4) == batching


# -- the plan within a budget -----------------------------------------------------------------
BUDGETS = [2 * GiB, 3 * GiB, 6 * GiB, 8 * GiB, 16 * GiB, 64 * GiB, 512 * GiB]


@pytest.mark.parametrize("name", list(MACHINES))
def test_no_plan_holds_more_than_its_budget(name):
    topology = MACHINES[name]
    for budget, models in itertools.product(BUDGETS, [INDUCTOR, {"bert": INDUCTOR["bert"]}]):
        try:
            layout = plan_layout(with_budget(topology, budget), demands(models))
        except PlanError as error:
            # Refused only when one worker of every model would not fit.
            one_each = sum(f.cost(1) for f in models.values())
            assert one_each > budget - 768 * MiB, (budget, error)
            assert "more than the memory budget" in str(error)
            continue
        assert layout.memory.total <= budget
        assert layout.memory.models == {n: models[n].cost(len(m.workers)) for n, m in layout.models.items()}
        # Cores stay busy: workers get more threads before any core is left idle, unless workers
        # had to be dropped beyond one per L3 domain.
        used = {cpu for m in layout.models.values() for w in m.workers for cpu in w.cpus}
        if "dropped" not in layout.memory.note:
            assert len(used) == layout.serving_cores, layout.memory.note


def test_a_16_cpu_6_gib_container_runs_fewer_multithreaded_workers():
    container = with_budget(machine("host-64c-2node", allowed="0-15"), 6 * GiB)
    unbounded = place(container, demands(), plan_layout(container, demands()).objective, None)
    layout = plan_layout(container, demands())
    assert sum(len(m.workers) for m in unbounded.models.values()) == 14  # one per serving core: ~12 GB
    assert shape(layout) == {"bert": (1, 8), "resnet50": (1, 6), "minilm": (1, 8)}
    assert layout.memory.total <= 6 * GiB
    assert layout.memory.note.startswith("reduced to fit: bert 5x1, resnet50 5x1, minilm 4x1 ->")
    assert "reduced to fit" in layout.summary()[-1]


def test_a_two_socket_server_is_reduced_only_when_its_memory_is_short():
    xeon = MACHINES["xeon-2s"]
    roomy = plan_layout(with_budget(xeon, 512 * GiB), demands())
    assert shape(roomy) == shape(plan_layout(xeon, demands())) and roomy.memory.note == ""
    tight = plan_layout(with_budget(xeon, 24 * GiB), demands())
    assert tight.memory.total <= 24 * GiB < roomy.memory.total
    assert all(threads > 1 for _, threads in shape(tight).values())


def test_workers_are_dropped_costliest_first_when_threads_cannot_grow():
    vm = MACHINES["this-vm"]  # one L3 domain of 2 cores: 1 x 2 is as wide as a worker gets
    assert shape(plan_layout(with_budget(vm, 8 * GiB), demands())) == {m: (2, 1) for m in INDUCTOR}
    assert shape(plan_layout(with_budget(vm, 4 * GiB), demands())) == {m: (1, 2) for m in INDUCTOR}
    single = plan_layout(with_budget(MACHINES["this-vm-taskset-1"], 4 * GiB), demands())
    assert shape(single) == {m: (1, 1) for m in INDUCTOR}


def test_one_worker_per_model_that_does_not_fit_is_refused_by_name():
    with pytest.raises(PlanError) as refused:
        plan_layout(with_budget(MACHINES["this-vm"], 2 * GiB), demands())
    message = str(refused.value)
    assert "more than the memory budget of 2.0 GiB" in message
    assert "bert 1.2 GiB per worker + 120 MiB shared" in message and "minilm" in message and "resnet50" in message


def test_without_a_footprint_or_a_budget_memory_is_not_planned():
    no_limit = dataclasses.replace(MACHINES["this-vm"], memory=Memory(24 * GiB, 20 * GiB))  # a bare machine
    unmeasured = plan_layout(no_limit, demands({**INDUCTOR, "bert": None}))
    assert unmeasured.memory is None and "no footprint measured yet for bert" in unmeasured.unplanned
    assert "memory: not planned" in unmeasured.summary()[-1]
    assert shape(unmeasured) == {m: (2, 1) for m in INDUCTOR}  # cores only
    assert plan_layout(MACHINES["this-vm"], demands()).unplanned == "no memory budget given"


def test_under_a_memory_limit_a_model_never_measured_starts_one_wide_worker():
    container = with_budget(machine("host-64c-2node", allowed="0-15"), 6 * GiB)
    layout = plan_layout(container, demands({**INDUCTOR, "bert": None}))
    assert shape(layout)["bert"] == (1, 8)  # one worker, as wide as an L3 domain
    assert "until then one worker each under the limit" in layout.unplanned and layout.memory is None


# A language model: 1 GiB of weights and runtime per worker, measured with 8 sequences of 256 MiB
# of KV cache each (Qwen2.5-0.5B in fp32 at a context of 32k holds 384 MiB per sequence).
LM_KV = Sequences(per_sequence=256 * MiB, most=8)
LM = Footprint(rss=3200 * MiB, pss=3100 * MiB, private=3072 * MiB, peak=3300 * MiB, workers=1, sequences=8)


def lm_demands(footprint: Footprint = LM, sequences: Sequences = LM_KV) -> list[Demand]:
    return [
        Demand(
            "lm",
            footprint=footprint,
            grouping=Grouping.DOMAIN,
            sequences=sequences,
            omp_wait_policy=OmpWaitPolicy.DEFAULT,
        )
    ]


def test_a_footprint_counts_a_language_models_kv_cache_per_sequence():
    three = LM.with_sequences(3, LM_KV.per_sequence)
    assert LM.per_worker - three.per_worker == 5 * 256 * MiB and three.shared == LM.shared
    assert three.sequences == 3 and three.with_sequences(8, LM_KV.per_sequence) == LM


def test_a_language_models_kv_cache_holds_fewer_contexts_to_fit_its_budget_and_says_so():
    """Under a tight budget the KV cache shrinks, not the sequences generated at once: they share it."""
    vm = MACHINES["this-vm"]  # one worker on both cores
    roomy = plan_layout(with_budget(vm, 8 * GiB), lm_demands())
    assert (roomy.models["lm"].sequences, roomy.models["lm"].kv_contexts) == (8, 8) and roomy.memory.note == ""
    # Measured at 8, asked for at most 4 (the model file's max_sequences): planned at 4, and 4 contexts.
    asked_four = plan_layout(with_budget(vm, 8 * GiB), lm_demands(sequences=Sequences(256 * MiB, 4))).models["lm"]
    assert (asked_four.sequences, asked_four.kv_contexts) == (4, 4)
    tight = plan_layout(with_budget(vm, 3 * GiB), lm_demands())
    contexts = tight.models["lm"].kv_contexts
    assert tight.models["lm"].sequences == 8
    assert 1 <= contexts < 8 and tight.memory.total <= 3 * GiB
    # The most that fits: one context more would not.
    one_more = LM.with_sequences(contexts + 1, LM_KV.per_sequence)
    assert (
        tight.memory.total + one_more.per_worker - LM.with_sequences(contexts, LM_KV.per_sequence).per_worker > 3 * GiB
    )
    assert tight.memory.note == f"reduced to fit: lm 1x2 (KV 8 contexts) -> lm 1x2 (KV {contexts} contexts)"
    assert f"8 sequence(s) at once per worker, sharing a KV cache of {contexts} context(s)" in "\n".join(
        tight.summary()
    )
    # A footprint measured with fewer contexts (a server the plan had narrowed) plans the same.
    measured_at_two = LM.with_sequences(2, LM_KV.per_sequence)
    assert plan_layout(with_budget(vm, 3 * GiB), lm_demands(measured_at_two)).models["lm"].kv_contexts == contexts


def test_a_language_model_that_does_not_fit_with_one_context_is_refused_with_its_kv_cache():
    with pytest.raises(PlanError) as refused:
        plan_layout(with_budget(MACHINES["this-vm"], int(1.5 * GiB)), lm_demands())
    assert "(with a KV cache of 1 context: 256 MiB)" in str(refused.value)


def test_a_language_models_sequences_reach_the_json_plan():
    layout = plan_layout(with_budget(MACHINES["epyc-96c"], 12 * GiB), lm_demands() + demands())
    raw = json.loads(json.dumps(layout.to_dict()))
    assert raw["models"]["lm"]["sequences"] == layout.models["lm"].sequences >= 1
    assert raw["models"]["lm"]["kv_contexts"] == layout.models["lm"].kv_contexts >= 1
    assert raw["models"]["bert"]["sequences"] == raw["models"]["bert"]["kv_contexts"] == 0
    assert (raw["models"]["lm"]["omp_wait_policy"], raw["models"]["bert"]["omp_wait_policy"]) == ("default", "")
    assert Layout.from_dict(raw) == layout


def test_the_json_plan_carries_its_memory():
    layout = plan_layout(with_budget(MACHINES["epyc-96c"], 16 * GiB), demands())
    raw = json.loads(json.dumps(layout.to_dict()))
    assert raw["memory"]["total"] == layout.memory.total <= raw["memory"]["budget"] == 16 * GiB
    assert raw["memory"]["frontend_heap"] == 512 * MiB  # 1/32 of the budget
    assert Layout.from_dict(raw) == layout


def test_kit_plan_takes_a_memory_budget_and_footprints(capsys):
    from kit.__main__ import main

    lscpu = str(FIXTURES / "host-64c-2node.txt")
    args = ["plan", "--lscpu", lscpu, "--cpus", "0-15", "--memory", "6Gi", "--models", "mine", "--json"]
    assert main([*args, "--footprint", "mine=1.3Gi"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["memory"]["budget"] == 6 * GiB and planned["memory"]["total"] <= 6 * GiB
    assert main([*args, "--footprint", "mine=8Gi"]) == 1
    assert "more than the memory budget of 6.0 GiB: mine 8.0 GiB per worker" in capsys.readouterr().err
    assert main([*args, "--footprint", "other=1Gi"]) == 1
    assert "--footprint names ['other']" in capsys.readouterr().err


# -- the server's side ------------------------------------------------------------------------
def test_the_frontend_heap_comes_from_the_plan_unless_the_preset_sets_one():
    layout = plan_layout(with_budget(MACHINES["this-vm"], 8 * GiB), demands())
    config = ServeConfig.from_preset("optimized")
    pool = f"{COMMON_POOL}=2"  # the VM's 2 CPUs, less one, floored at 2
    assert jvm_args(config, layout) == f"{ServeConfig.frontend_jvm_args} -Xmx256m {pool}"
    unplanned = plan_layout(MACHINES["this-vm"], demands())
    assert jvm_args(config, unplanned) == f"{ServeConfig.frontend_jvm_args} {pool}"
    own = dataclasses.replace(config, frontend_jvm_args=f"-Xmx1g {COMMON_POOL}=8")
    assert jvm_args(own, layout) == f"-Xmx1g {COMMON_POOL}=8"
    jvms_own = dataclasses.replace(config, frontend_jvm_args="")  # the JVM's choices, but for the planned heap
    assert jvm_args(jvms_own, layout) == "-Xmx256m"


def test_the_frontends_common_pool_is_its_cpus_less_one_and_never_one():
    # A pool of one would have the JVM start a thread for each message to a worker.
    assert [common_pool_threads(cpus) for cpus in (1, 2, 3, 8, 64)] == [2, 2, 2, 7, 63]
    config = ServeConfig.from_preset("optimized")
    for name, host in MACHINES.items():
        layout = plan_layout(host, demands())
        threads = common_pool_threads(len(layout.frontend_cpus))
        assert jvm_args(config, layout).endswith(f"{COMMON_POOL}={threads}"), name


def test_a_preset_memory_budget_narrows_the_machines_and_a_tighter_cgroup_still_binds(monkeypatch):
    import kit.serve_config

    monkeypatch.setattr(kit.serve_config, "recorded", lambda archive, batch_size: INDUCTOR[archive.stem])
    vm = dataclasses.replace(MACHINES["this-vm"], memory=Memory(24 * GiB, 20 * GiB, limit=None))
    config = ServeConfig.from_preset("optimized", models=("bert", "resnet50", "minilm"), memory="5Gi")
    assert config.layout(vm).memory.budget == 5 * GiB
    assert shape(config.layout(vm)) == {m: (1, 2) for m in INDUCTOR}
    capped = dataclasses.replace(vm, memory=Memory(24 * GiB, 20 * GiB, limit=4 * GiB))
    assert config.layout(capped).memory.budget == 4 * GiB
    with pytest.raises(ConfigError, match="memory: memory size '4 gigs' is not a size"):
        ServeConfig.from_preset("optimized", memory="4 gigs")


def test_proc_memory_lines_are_read_by_key_in_bytes():
    node = "Node 1 MemTotal:       32768 kB\nNode 1 MemFree:        1024 kB\nNode 1 HugePages_Total:     0\n"
    assert kb_fields(node) == {"MemTotal": 32768 * 1024, "MemFree": 1024 * 1024}
    assert meminfo_bytes("MemTotal:  2048 kB\n", "MemTotal") == 2048 * 1024
    with pytest.raises(TopologyError, match="no MemAvailable in meminfo"):
        meminfo_bytes("MemTotal:  2048 kB\n", "MemAvailable")
