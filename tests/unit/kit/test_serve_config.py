import json
import os
from pathlib import Path

import pytest

from handlers.switches import Diagnostics, served_settings
from handlers.typed_config import SettingsError, parse_settings
from kit import serve_config
from kit.layout import Sequences
from kit.paths import STORE
from kit.properties import COMMON_POOL, common_pool_threads, launcher_args, render, worker_environment
from kit.serve_config import Allocator, ConfigError, Placement, ServeConfig
from kit.topology import parse_topology
from tests.conftest import BUNDLED_MODELS
from tests.machines import FIXTURES


def properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def test_optimized_preset_renders_the_planned_workers():
    config = ServeConfig.from_preset("optimized", models=BUNDLED_MODELS)
    xeon = parse_topology((FIXTURES / "xeon-2s-28c-smt.txt").read_text())
    layout = config.layout(xeon)
    props = properties(render(config, Path("/store"), layout))
    # The kit pins the workers itself (kit/pin_worker.py), not TorchServe's launcher.
    assert props["cpu_launcher_enable"] == "false" and "cpu_launcher_args" not in props
    models = json.loads(props["models"])
    # 56 cores, 7 for the frontend: 49 single-threaded workers split between three models.
    assert [models[m]["1.0"]["minWorkers"] for m in ("bert", "minilm", "resnet50")] == [17, 16, 16]
    assert all(w.threads == 1 for m in layout.models.values() for w in m.workers)
    assert props["inference_address"] == "http://127.0.0.1:8080"
    assert props["management_address"] == "http://127.0.0.1:8081"
    assert props["metrics_address"] == "http://127.0.0.1:8082"
    assert props["metrics_mode"] == "prometheus"
    assert props["disable_token_authorization"] == "true"  # loopback: frictionless local start
    assert props["enable_model_api"] == "false"
    assert props["allowed_urls"] == r"file://\\Q/store\\E/.*"  # only the local model store (Java-escaped)
    assert props["max_request_size"] == str(16 * 1024 * 1024)
    # Each an archive directory, by absolute path (TorchServe tries a name in its working directory first).
    assert props["load_models"] == "/store/bert,/store/minilm,/store/resnet50"


def test_fixed_launcher_preset_renders_torchserve_launcher():
    config = ServeConfig.from_preset("fixed-2x1")
    assert config.layout(parse_topology((FIXTURES / "this-vm-2c.txt").read_text())) is None
    props = properties(render(config, Path("/store")))
    assert props["cpu_launcher_enable"] == "true"
    assert props["cpu_launcher_args"] == "--disable_iomp --enable_tcmalloc --ncores-per-instance 1"
    assert '"minWorkers":2' in props["models"]


def test_a_cpu_set_narrows_the_plan():
    config = ServeConfig.from_preset("optimized", cpus="1")
    assert config.allowed_cpus == {1}
    layout = config.layout(parse_topology((FIXTURES / "this-vm-2c.txt").read_text(), {0, 1}))
    assert {name: [w.cpus for w in m.workers] for name, m in layout.models.items()} == {
        "resnet50": [(1,)],
        "bert": [(1,)],
        "minilm": [(1,)],
    }
    assert layout.frontend_cpus == (1,)
    busy = {cpu for cpu in range(4096) if cpu not in os.sched_getaffinity(0)}
    if busy:  # a CPU this process may not use is refused by name when the server starts
        outside = min(busy)
        with pytest.raises(ConfigError, match=f"cpus '{outside}' includes CPUs {outside} this process may not use"):
            ServeConfig.from_preset("optimized", cpus=str(outside)).allowed_cpus  # noqa: B018


def test_baseline_leaves_torchserve_defaults_alone():
    config = ServeConfig.from_preset("baseline")
    props = properties(render(config, Path("/store")))
    assert props["cpu_launcher_enable"] == "false"
    assert "cpu_launcher_args" not in props
    assert "default_workers_per_model" not in props  # TorchServe's default: one per core
    assert "minWorkers" not in props["models"]
    assert worker_environment(config) == {}


def test_non_loopback_bind_forces_token_auth_and_keeps_management_local():
    config = ServeConfig.from_preset("optimized", bind="0.0.0.0")
    assert config.token_auth_enabled
    props = properties(render(config, Path("/s")))
    assert props["disable_token_authorization"] == "false"
    assert props["inference_address"] == "http://0.0.0.0:8080"
    assert props["management_address"] == "http://127.0.0.1:8081"  # never exposed unless asked
    exposed = ServeConfig.from_preset("optimized", management_bind="0.0.0.0")
    assert exposed.token_auth_enabled
    assert properties(render(exposed, Path("/s")))["management_address"] == "http://0.0.0.0:8081"
    with pytest.raises(ConfigError, match="token_auth cannot be off on the non-loopback bind 0.0.0.0"):
        ServeConfig.from_preset("optimized", bind="0.0.0.0", token_auth=False)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"placement": "launcher", "workers": 2, "threads": len(os.sched_getaffinity(0))}, "exceeds the"),
        ({"placement": "none", "allocator": "tcmalloc"}, "preloaded for pinned workers; set placement: plan or"),
        ({"workers": 4}, "workers: 4 with placement plan: the plan gives each model its workers"),
        ({"cpus": "1-x"}, "not like 0-3,8"),
        ({"allocator": "mimalloc"}, "allocator 'mimalloc' is unknown; choose one of: default, jemalloc, tcmalloc"),
        ({"workers": 0}, "workers must be >= 1"),
        ({"wrokers": 1}, r"unknown setting\(s\) \['wrokers'\]"),
    ],
)
def test_bad_layouts_are_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message):
        ServeConfig.from_preset("optimized", **overrides)


def test_unknown_preset_lists_choices():
    with pytest.raises(
        ConfigError, match="preset 'fastest' not found; choose one of: baseline, container, fixed-2x1, optimized"
    ):
        ServeConfig.from_preset("fastest")


def test_launcher_args_per_layout():
    one = ServeConfig(placement=Placement.LAUNCHER, workers=1, threads=2, allocator=Allocator.JEMALLOC)
    assert launcher_args(one) == "--disable_iomp --enable_jemalloc --ncores-per-instance 2 --ninstances 1 --rank 0"
    # With several workers the frontend appends --ninstances/--rank per worker itself.
    two = ServeConfig(placement=Placement.LAUNCHER, workers=2, threads=1, allocator=Allocator.TCMALLOC)
    assert launcher_args(two) == "--disable_iomp --enable_tcmalloc --ncores-per-instance 1"


def test_thread_environment_without_launcher():
    config = ServeConfig(placement=Placement.NONE, allocator=Allocator.DEFAULT, threads=1)
    assert worker_environment(config) == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def test_diagnostics_reach_the_workers_environment():
    switches = {"profile_requests": 20, "itt_ops": True, "whole_jpeg_decode": True}
    config = ServeConfig.from_preset("optimized", diagnostics=switches)
    env = worker_environment(config)
    assert env["KIT_PROFILE_REQUESTS"] == "20" and env["KIT_ITT_OPS"] == "1" and env["KIT_WHOLE_JPEG_DECODE"] == "1"
    diagnostics = Diagnostics.from_environment(env)
    assert diagnostics.profile_requests == 20 and diagnostics.itt_ops and diagnostics.whole_jpeg_decode
    assert not Diagnostics.from_environment({}).whole_jpeg_decode
    assert "KIT_PROFILE_REQUESTS" not in worker_environment(ServeConfig.from_preset("optimized"))
    # The stage metrics are on unless switched off (to measure their cost).
    assert diagnostics.stage_metrics and Diagnostics.from_environment({}).stage_metrics
    off = worker_environment(ServeConfig.from_preset("optimized", diagnostics={"stage_metrics": False}))
    assert not Diagnostics.from_environment(off).stage_metrics


def test_a_diagnostics_override_keeps_the_presets_other_switches(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("diagnostics: {whole_jpeg_decode: true}\n")
    config = ServeConfig.from_preset(str(preset), diagnostics={"profile_requests": 5})
    assert config.diagnostics == Diagnostics(profile_requests=5, whole_jpeg_decode=True)


@pytest.mark.parametrize(
    "diagnostics, message",
    [
        ({"profile_requests": -1}, "profile_requests must be >= 0, got -1"),
        ({"itt_op": True}, r"diagnostics: unknown setting\(s\) \['itt_op'\] for Diagnostics"),
        ({"itt_ops": "yes"}, "itt_ops must be true or false, got 'yes'"),
        (True, "diagnostics must be a mapping"),
    ],
)
def test_a_wrong_diagnostics_section_is_refused_by_name(diagnostics, message):
    with pytest.raises(SettingsError, match=message):
        ServeConfig.from_preset("optimized", diagnostics=diagnostics)


def test_openvino_workers_keep_glibc_malloc():
    openvino = ServeConfig.from_preset("fixed-2x1", variant="openvino-int8")
    assert openvino.allocator is Allocator.TCMALLOC  # what the preset asks for
    assert openvino.served_allocator is Allocator.DEFAULT  # what the worker gets
    assert "--use_default_allocator" in launcher_args(openvino)
    inductor = ServeConfig.from_preset("fixed-2x1")
    assert inductor.served_allocator is Allocator.TCMALLOC
    assert "--enable_tcmalloc" in launcher_args(inductor)


def test_a_variant_is_resolved_once_with_its_traits():
    config = ServeConfig.from_preset("optimized", variant="ipex")
    assert config.variant.name == "ipex" and config.variant.backend.value == "ipex"
    assert config.variant.environment.name == ".venv-ipex"
    assert config.variant.archive("bert").parts[-3:] == ("model_store", "ipex", "bert")
    assert ServeConfig.from_preset("optimized").variant.environment.name == ".venv"
    # What the state file stores (JSON) and reads back: the name, resolved again.
    assert parse_settings(ServeConfig, json.loads(json.dumps(config.to_dict()))) == config
    diagnosing = ServeConfig.from_preset("optimized", diagnostics={"profile_requests": 3, "itt_ops": True})
    assert parse_settings(ServeConfig, json.loads(json.dumps(diagnosing.to_dict()))) == diagnosing
    with pytest.raises(ConfigError, match="variant 'openvino-int4' is unknown; choose one of: aoti, aoti-int8, eager"):
        ServeConfig.from_preset("optimized", variant="openvino-int4")


def test_models_of_different_variants_get_their_archives_and_allocators():
    config = ServeConfig.from_preset("optimized", models=["resnet50", "bert"], model_variants={"bert": "openvino"})
    assert config.mixed_variants and config.variant_of("resnet50").name == "inductor"
    assert config.archives() == {
        "resnet50": STORE / "inductor" / "resnet50",
        "bert": STORE / "openvino" / "bert",
    }
    # Each model's workers get their backend's allocator: OpenVINO crashes under a preloaded one.
    layout = config.layout(parse_topology((FIXTURES / "xeon-2s-28c-smt.txt").read_text()))
    assert (layout.models["resnet50"].allocator, layout.models["bert"].allocator) == ("tcmalloc", "default")
    assert parse_settings(ServeConfig, json.loads(json.dumps(config.to_dict()))) == config
    assert not ServeConfig.from_preset("optimized", model_variants={"bert": "inductor"}).mixed_variants


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model_variants": {"vit": "openvino"}}, r"model_variants names \['vit'\], which are not served"),
        ({"model_variants": {"bert": "ipex"}}, "mixes variants of different Python environments"),
        (
            {"model_variants": {"bert": "openvino"}, "placement": "launcher", "workers": 1, "threads": 1},
            "use placement: plan",
        ),
        ({"model_variants": {"bert": "fastest"}}, "variant 'fastest' is unknown"),
        ({"model_variants": ["bert", "openvino"]}, "model_variants must be a mapping"),
        ({"model_sequences": {"vit": 4}}, r"model_sequences names \['vit'\], which are not served"),
        ({"model_sequences": {"bert": 0}}, r"a number of sequences >= 1 per model, got \{'bert': 0\}"),
        ({"model_sequences": {"bert": "many"}}, "model_sequences"),
        (
            {"model_sequences": {"bert": 4}, "placement": "launcher", "workers": 1, "threads": 1},
            "model_sequences needs placement: plan",
        ),
        ({"model_settings": {"vit": {"prompt_lookup": 4}}}, r"model_settings names \['vit'\], which are not served"),
        ({"model_settings": {"bert": {"context_length": 64}}}, r"cannot serve \['context_length'\] over the archive's"),
        (
            {"model_settings": {"bert": {"prompt_lookup": -1}}},
            "model_settings of bert: prompt_lookup must be 0 or more",
        ),
        ({"model_settings": {"bert": 4}}, "model_settings.bert must be a mapping"),
    ],
)
def test_per_model_settings_errors_name_the_problem(overrides, message):
    with pytest.raises(ConfigError, match=message):
        ServeConfig.from_preset("optimized", **overrides)


def test_a_presets_model_sequences_replace_the_archives_and_name_only_language_models(monkeypatch):
    """`make tune MODELS=lm` writes the sequences it measured best; the plan starts from them (and may
    serve fewer under a memory budget) instead of the archive's max_sequences."""
    archived = Sequences(per_sequence=2**20, most=8)
    monkeypatch.setattr(serve_config, "served_sequences", lambda model, archive: archived if model == "bert" else None)
    config = ServeConfig.from_preset("optimized", models=["bert", "resnet50"], model_sequences={"bert": 32})
    assert config.demand("bert").sequences == Sequences(per_sequence=2**20, most=32)
    assert ServeConfig.from_preset("optimized", models=["bert"]).demand("bert").sequences == archived
    assert parse_settings(ServeConfig, json.loads(json.dumps(config.to_dict()))) == config
    wrong = ServeConfig.from_preset("optimized", models=["resnet50"], model_sequences={"resnet50": 4})
    with pytest.raises(ConfigError, match="model_sequences names 'resnet50', which is not a language model"):
        wrong.demand("resnet50")


def test_a_presets_model_settings_reach_its_workers_for_language_models_only(monkeypatch):
    """What `make tune MODELS=lm` writes where prompt lookup paid: in every worker's environment,
    read back by the model's own (handlers/switches.py); a model that is no language model is refused."""
    monkeypatch.setattr(
        serve_config, "served_sequences", lambda model, archive: Sequences(2**20, 8) if model == "bert" else None
    )
    config = ServeConfig.from_preset(
        "optimized", models=["bert", "resnet50"], model_settings={"bert": {"prompt_lookup": 4}}
    )
    environment = worker_environment(config)
    assert (
        served_settings("bert", environment) == {"prompt_lookup": 4} and served_settings("resnet50", environment) == {}
    )
    assert (
        config.demand("bert").sequences
        and parse_settings(ServeConfig, json.loads(json.dumps(config.to_dict()))) == config
    )
    wrong = ServeConfig.from_preset("optimized", models=["resnet50"], model_settings={"resnet50": {"prompt_lookup": 4}})
    with pytest.raises(ConfigError, match="model_settings names 'resnet50', which is not a language model"):
        wrong.demand("resnet50")


def test_frontend_jvm_options_are_rendered_as_vmargs(tmp_path):
    pool = f"{COMMON_POOL}={common_pool_threads(len(os.sched_getaffinity(0)))}"  # not planned: this process's CPUs
    config = ServeConfig.from_preset("optimized", frontend_jvm_args="-XX:+UseSerialGC -Xss512k")
    assert properties(render(config, Path("/store")))["vmargs"] == f"-XX:+UseSerialGC -Xss512k {pool}"
    assert "vmargs" not in properties(render(ServeConfig.from_preset("baseline"), Path("/store")))  # JVM defaults
    default = ServeConfig.frontend_jvm_args
    assert default.startswith("-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xmn24m -Dio.netty.allocator.maxOrder=9")
    assert properties(render(ServeConfig.from_preset("optimized"), Path("/store")))["vmargs"] == f"{default} {pool}"
    written = tmp_path / "tuned.yaml"  # a preset that does not name it, as `make tune` writes one
    written.write_text("variant: inductor\nbatch_size: 4\n")
    assert ServeConfig.from_preset(str(written)).frontend_jvm_args == default
    with pytest.raises(ConfigError, match=r"frontend_jvm_args takes JVM options .* got \['UseSerialGC'\]"):
        ServeConfig.from_preset("optimized", frontend_jvm_args="UseSerialGC")
