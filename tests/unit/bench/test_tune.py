"""make tune's choice: one shared layout for the server, the fastest backend per model within it."""

from __future__ import annotations

import pytest

from bench.tune import fastest_layout
from handlers.typed_config import parse_settings
from kit.serve_config import ServeConfig
from tests.unit.bench.rows import row_result


def served(model: str, variant: str, allocator: str, rps: float, **overrides):
    return row_result(model=model, variant=variant, allocator=allocator, requests_per_s=rps, **overrides)


def baseline(model: str, rps: float):
    return row_result(
        model=model,
        variant="eager",
        placement="none",
        allocator="default",
        workers=None,
        threads=None,
        baseline=True,
        requests_per_s=rps,
    )


def test_each_model_keeps_its_fastest_backend_within_the_shared_layout():
    results = [
        served("resnet50", "inductor", "tcmalloc", 40.0),
        served("bert", "inductor", "tcmalloc", 8.0),
        served("resnet50", "inductor", "jemalloc", 41.0),
        served("bert", "inductor", "jemalloc", 7.0),
        # OpenVINO keeps glibc malloc whatever the preset says: it fits any allocator's layout.
        served("resnet50", "openvino", "default", 36.0),
        served("bert", "openvino", "default", 16.0),
        baseline("resnet50", 20.0),
        baseline("bert", 5.0),
    ]
    layout, rows = fastest_layout(results)
    # jemalloc: resnet50 41 (its best) and bert 16 on OpenVINO (its best) beat tcmalloc's 40 + 16.
    assert layout["allocator"] == "jemalloc"
    assert layout["variant"] == "inductor" and layout["model_variants"] == {"bert": "openvino"}
    assert {m: (r.variant, r.requests_per_s) for m, r in rows.items()} == {
        "resnet50": ("inductor", 41.0),
        "bert": ("openvino", 16.0),
    }
    config = parse_settings(ServeConfig, {k: v for k, v in layout.items() if k != "workers"})
    assert config.variant_of("bert").name == "openvino" and config.allocator_of("bert").value == "default"
    assert config.allocator_of("resnet50").value == "jemalloc"


def test_one_backend_for_all_writes_no_overrides():
    results = [served(m, "openvino", "default", rps) for m, rps in (("resnet50", 40.0), ("bert", 16.0))]
    results += [served(m, "inductor", "tcmalloc", rps) for m, rps in (("resnet50", 30.0), ("bert", 8.0))]
    layout, _ = fastest_layout(results)
    assert layout["variant"] == "openvino" and "model_variants" not in layout


def test_rows_with_errors_or_a_missing_model_cannot_win():
    results = [
        served("resnet50", "inductor", "tcmalloc", 50.0, non_2xx=3),
        served("bert", "inductor", "tcmalloc", 9.0),
        served("resnet50", "inductor", "jemalloc", 30.0),  # no bert row in this layout
    ]
    with pytest.raises(ValueError, match="no layout was measured for every model without errors"):
        fastest_layout(results)


def test_the_preset_is_chosen_from_the_rows_that_ran_and_names_those_that_failed(tmp_path, monkeypatch):
    from bench import tune
    from bench.results import RowFailure
    from kit import serve_config

    for preset in serve_config.PRESETS.glob("*.yaml"):  # the others stay readable; tuned.yaml lands here
        (tmp_path / preset.name).write_text(preset.read_text())
    for module in (tune, serve_config):
        monkeypatch.setattr(module, "PRESETS", tmp_path)
    monkeypatch.setattr(tune, "CONFIG", tmp_path)
    results = [served("resnet50", "inductor", "tcmalloc", 40.0), served("bert", "inductor", "tcmalloc", 8.0)]
    failed = [RowFailure("bert", "plan backend variant=openvino", "served", False, "ServerError: ...", "x")]
    path = tune.write_tuned_preset("tuned", results, failed)
    header = path.read_text().splitlines()[:2]
    assert header[1] == "# Chosen without the rows that failed: bert / plan backend variant=openvino"
    assert ServeConfig.from_preset(str(path)).variant.name == "inductor"


def test_the_preset_serves_the_models_it_measured_only(tmp_path, monkeypatch):
    """A mixed winner's majority variant has no archive for a model the run did not measure
    (round 3 of a `make tune` here: inductor-mkl, and no inductor-mkl minilm archive)."""
    from bench import tune
    from kit import serve_config

    for preset in serve_config.PRESETS.glob("*.yaml"):
        (tmp_path / preset.name).write_text(preset.read_text())
    for module in (tune, serve_config):
        monkeypatch.setattr(module, "PRESETS", tmp_path)
    monkeypatch.setattr(tune, "CONFIG", tmp_path)
    monkeypatch.setattr(tune, "STORE", tmp_path / "store")
    linked = {}
    monkeypatch.setattr(tune, "link_store", lambda archives, store: linked.update(archives))
    results = [served("resnet50", "inductor-mkl", "tcmalloc", 40.0), served("bert", "openvino", "default", 16.0)]
    path = tune.write_tuned_preset("tuned", results)
    config = ServeConfig.from_preset(str(path))
    assert config.models == ("bert", "resnet50") and config.variant.name == "inductor-mkl"
    assert config.model_variants["bert"].name == "openvino"
    assert set(linked) == {"bert", "resnet50"}
