"""model_store/build.py: what the archive build checks before and while it builds."""

from __future__ import annotations

import shutil
import types

import pytest

from handlers.typed_config import SettingsError, parse_settings


def test_model_files_parse_into_settings():
    from handlers.archive import handler_class
    from kit.models import Model, SourceKind, model_names
    from kit.variant import Variant, variant_names
    from model_store.build import merged_config
    from model_store.recipes import RECIPES

    for model in map(Model.load, model_names()):
        if model.source.kind is SourceKind.RECIPE:
            assert model.source.location in RECIPES, f"{model.file}: no recipe {model.source.location!r}"
        settings_class = handler_class(model.task.handler).settings_class
        for name in variant_names():
            variant = Variant.load(name)
            merged = merged_config(model.serving, variant.overlay)
            if variant.settings.weights not in settings_class.weight_formats:  # a language model's variant
                with pytest.raises(SettingsError, match="weight-only quantization.*serves a language model"):
                    parse_settings(settings_class, merged["handler"])
                continue
            settings = parse_settings(settings_class, merged["handler"])  # raises
            assert (settings.backend, settings.dtype, settings.weights) == (
                variant.backend,
                variant.dtype,
                variant.settings.weights,
            )


def test_archive_build_stops_early_when_the_disk_is_nearly_full(tmp_path, monkeypatch):
    from model_store import build

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(build.shutil, "disk_usage", lambda path: usage._replace(free=int(1.5e9)))
    with pytest.raises(SystemExit, match=rf"1.5 GB free in {tmp_path}; building inductor/bert needs 4 GB"):
        build.require_free_space([tmp_path], "inductor/bert")


def test_the_build_skips_a_variant_this_cpu_cannot_serve_only_when_asked(monkeypatch, capsys):
    from model_store import build

    built = []
    monkeypatch.setattr(build, "archive", lambda model, variant: built.append((model.name, variant.name)))
    monkeypatch.setattr(build.Variant, "refusal", lambda self: "no bf16 here" if self.name == "openvino-bf16" else "")
    build.main(["--models", "resnet50", "--variants", "openvino-bf16,eager", "--where-supported"])
    assert built == [("resnet50", "eager")]
    assert "openvino-bf16 skipped on this CPU: no bf16 here" in capsys.readouterr().out


def finished(code: int, output: str):
    """subprocess.run standing in for model_store.lm_compile: writes its output, exits with `code`."""

    def run(command, stdout, **options):
        assert command[1:3] == ["-m", "model_store.lm_compile"]
        assert options["env"]["TORCHINDUCTOR_CACHE_DIR"] != options.get("cwd")  # a cache of the build's own
        stdout.write(output)
        return types.SimpleNamespace(returncode=code)

    return run


def test_a_language_models_inductor_graphs_are_compiled_at_build_and_a_refusal_installs_nothing(
    tmp_path, monkeypatch, capsys
):
    from kit import long_step
    from model_store import build

    staging = tmp_path / "files"
    staging.mkdir()
    ready = (
        "lm ready: backend=inductor ... warmup=9.0s graphs=2 (0 loaded whole, 0 from the compile cache)\n"
        "shipped inductor-0f (3.0 MB; whole graphs: decode, mixed)\n"
    )
    monkeypatch.setattr(long_step.subprocess, "run", finished(0, ready))
    build.compile_language_model({"backend": "inductor"}, staging, "inductor/lm")
    said = capsys.readouterr().out
    assert "inductor/lm: compiling its graphs as a worker's start does: done in " in said
    assert "inductor/lm: shipped inductor-0f (3.0 MB; whole graphs: decode, mixed) " in said
    assert "(graphs=2 (0 loaded whole, 0 from the compile cache))" in said
    refused = "bfloat16 answers too far from the float model on held-out prompts: greedy tokens 50.0% equal\n"
    monkeypatch.setattr(long_step.subprocess, "run", finished(3, refused))
    with pytest.raises(build.VariantRefused, match="inductor/lm is not installed: bfloat16 answers too far"):
        build.compile_language_model({"backend": "inductor"}, staging, "inductor/lm")
    monkeypatch.setattr(long_step.subprocess, "run", finished(1, "Traceback ...\nRuntimeError: out of memory\n"))
    with pytest.raises(
        RuntimeError,
        match="(?s)worker's start does failed \\(exit 1\\); the end of .*compile.log:.*RuntimeError: out of memory",
    ):
        build.compile_language_model({"backend": "inductor"}, staging, "inductor/lm")
    monkeypatch.setattr(long_step.subprocess, "run", finished(0, "shipped inductor-0f (3.0 MB)\n"))
    build.compile_language_model({"backend": "inductor"}, staging, "inductor/lm")
    assert "(graphs not said)" in capsys.readouterr().out  # a worker that did not say what it compiled
    # Other backends compile in the worker (eager: nothing to compile) or are exported (openvino).
    monkeypatch.setattr(long_step.subprocess, "run", finished(1, "not run"))
    build.compile_language_model({"backend": "eager"}, staging, "eager/lm")


def test_a_build_of_an_archive_being_built_waits_for_it_and_others_do_not(tmp_path, capsys):
    """Two builds of one archive at once (two `make archive`, or CI's builds beside its tests) would
    both write it: the second waits for the first's lock (flock, per open file, so threads show it)."""
    import threading

    from model_store.build import building

    entered = threading.Event()

    def second() -> None:
        with building(tmp_path, "m", "eager/m"):
            entered.set()

    with building(tmp_path, "m", "eager/m"):
        thread = threading.Thread(target=second)
        thread.start()
        assert not entered.wait(0.5), "a second build went ahead while the first held the archive"
        with building(tmp_path, "other", "eager/other"):  # another archive is not held up
            pass
    thread.join(10)
    assert entered.is_set()
    assert "[archive] eager/m: another build of it is running; waiting for it" in capsys.readouterr().out
