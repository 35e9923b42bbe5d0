import os
from pathlib import Path

import pytest

from handlers.settings import parse_settings
from kit.serve_config import Allocator, ConfigError, ServeConfig, launcher_args, render, worker_environment


def properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def test_optimized_preset_renders_launcher_and_allocator():
    config = ServeConfig.from_preset("optimized")
    props = properties(render(config, Path("/store")))
    assert props["cpu_launcher_enable"] == "true"
    assert "--enable_tcmalloc" in props["cpu_launcher_args"]
    assert props["inference_address"] == "http://127.0.0.1:8080"
    assert props["management_address"] == "http://127.0.0.1:8081"
    assert props["metrics_address"] == "http://127.0.0.1:8082"
    assert props["metrics_mode"] == "prometheus"
    assert props["disable_token_authorization"] == "true"  # loopback: frictionless local start
    assert props["enable_model_api"] == "false"
    assert props["allowed_urls"] == r"file://\\Q/store\\E/.*"  # only the local model store (Java-escaped)
    assert props["max_request_size"] == str(16 * 1024 * 1024)
    assert props["load_models"] == "resnet50.mar,bert.mar,minilm.mar"
    assert '"minWorkers":2' in props["models"]


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
        ({"workers": 2, "threads": os.cpu_count(), "launcher": True}, "exceeds the"),
        ({"launcher": False, "allocator": "tcmalloc"}, "preloaded by the launcher; set launcher: true"),
        ({"allocator": "mimalloc"}, "allocator 'mimalloc' is unknown; choose one of: default, jemalloc, tcmalloc"),
        ({"workers": 0}, "workers must be >= 1"),
        ({"wrokers": 1}, r"unknown setting\(s\) \['wrokers'\]"),
    ],
)
def test_bad_layouts_are_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message):
        ServeConfig.from_preset("optimized", **overrides)


def test_unknown_preset_lists_choices():
    with pytest.raises(ConfigError, match="preset 'fastest' not found; choose one of: baseline, optimized"):
        ServeConfig.from_preset("fastest")


def test_launcher_args_per_layout():
    one = ServeConfig(workers=1, threads=2, allocator=Allocator.JEMALLOC)
    assert launcher_args(one) == "--disable_iomp --enable_jemalloc --ncores-per-instance 2 --ninstances 1 --rank 0"
    # With several workers the frontend appends --ninstances/--rank per worker itself.
    two = ServeConfig(workers=2, threads=1, allocator=Allocator.TCMALLOC)
    assert launcher_args(two) == "--disable_iomp --enable_tcmalloc --ncores-per-instance 1"


def test_thread_environment_without_launcher():
    config = ServeConfig(launcher=False, allocator=Allocator.DEFAULT, threads=1)
    assert worker_environment(config) == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def test_diagnostics_reach_the_workers_environment():
    config = ServeConfig.from_preset("optimized", profile_requests=20, itt_ops=True)
    env = worker_environment(config)
    assert env["KIT_PROFILE_REQUESTS"] == "20" and env["KIT_ITT_OPS"] == "1"
    assert "KIT_PROFILE_REQUESTS" not in worker_environment(ServeConfig.from_preset("optimized"))


def test_openvino_workers_keep_glibc_malloc():
    openvino = ServeConfig.from_preset("optimized", variant="openvino-int8")
    assert openvino.allocator is Allocator.TCMALLOC  # what the preset asks for
    assert openvino.served_allocator is Allocator.DEFAULT  # what the worker gets
    assert "--use_default_allocator" in launcher_args(openvino)
    inductor = ServeConfig.from_preset("optimized")
    assert inductor.served_allocator is Allocator.TCMALLOC
    assert "--enable_tcmalloc" in launcher_args(inductor)


def test_a_variant_is_resolved_once_with_its_traits():
    config = ServeConfig.from_preset("optimized", variant="ipex")
    assert config.variant.name == "ipex" and config.variant.backend.value == "ipex"
    assert config.variant.environment.name == ".venv-ipex"
    assert config.variant.archive("bert").parts[-3:] == ("model_store", "ipex", "bert.mar")
    assert ServeConfig.from_preset("optimized").variant.environment.name == ".venv"
    # What the state file stores and reads back: the name, resolved again.
    assert parse_settings(ServeConfig, config.to_dict()) == config
    with pytest.raises(ConfigError, match="variant 'openvino-int4' is unknown; choose one of: aoti, aoti-int8, eager"):
        ServeConfig.from_preset("optimized", variant="openvino-int4")
