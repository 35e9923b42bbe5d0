"""model_store/lm_compile.py --store: the archives an image's build compiles whole graphs for (its
Python's), each in a worker's start of its own."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import yaml

from handlers.archive_files import MANIFEST, MODEL_CONFIG
from handlers.backends import cpu_flags
from handlers.backends.inductor import HEADERS, HEADERS_VAR
from handlers.generation.compiled import forward_dir
from model_store import lm_compile


def archive(store: Path, variant: str, name: str, handler: str, settings: dict) -> Path:
    path = store / variant / name
    (path / MANIFEST).parent.mkdir(parents=True)
    (path / MANIFEST).write_text(json.dumps({"model": {"modelName": name, "handler": handler}}))
    (path / MODEL_CONFIG).write_text(yaml.safe_dump({"handler": settings}))
    return path


def test_an_image_compiles_whole_graphs_for_its_inductor_language_models_that_lack_them(tmp_path, monkeypatch, capsys):
    lm = archive(tmp_path, "inductor", "lm", "text_generation.py", {"backend": "inductor"})
    ready = archive(tmp_path, "inductor", "ready", "text_generation.py", {"backend": "inductor"})
    forward_dir(ready, cpu_flags()).mkdir(parents=True)  # graphs for this Python, versions and CPU
    archive(tmp_path, "eager", "lm", "text_generation.py", {"backend": "eager"})  # nothing compiled
    archive(tmp_path, "openvino", "lm", "text_generation.py", {"backend": "openvino"})  # an IR
    archive(tmp_path, "inductor", "photo", "image_classification.py", {"architecture": "resnet50"})
    assert lm_compile.without_graphs(tmp_path) == [lm]

    runs = []

    def run(command, env, capture_output, text):
        runs.append((command, env, Path(env["TORCHINDUCTOR_CACHE_DIR"]).is_dir()))
        graph = forward_dir(lm, cpu_flags()) / "decode.graph"
        graph.parent.mkdir(parents=True, exist_ok=True)
        graph.write_bytes(b"whole")
        graph.chmod(0o600)  # as torch saves it
        code = len(runs) - 1  # the first succeeds, the next fails
        return types.SimpleNamespace(returncode=code, stdout="shipped inductor-0f (3.0 MB)\n", stderr="Traceback\n")

    monkeypatch.setattr(lm_compile.subprocess, "run", run)
    assert lm_compile.compile_store(tmp_path) == 0
    said = capsys.readouterr().err
    assert "[graphs] inductor/lm: compiling its whole graphs for Python " in said
    assert "[graphs] inductor/lm: shipped inductor-0f (3.0 MB), in " in said
    ((command, env, cache_existed),) = runs
    assert command[1:5] == ["-m", "model_store.lm_compile", str(lm), "lm"]
    assert json.loads(command[5]) == {"backend": "inductor"}
    # A cache of its own, thrown away after: the image keeps only what is shipped into the archive.
    assert cache_existed and not Path(env["TORCHINDUCTOR_CACHE_DIR"]).exists()
    assert Path(env[HEADERS_VAR]) == Path(env["TORCHINDUCTOR_CACHE_DIR"]) / HEADERS  # never shipped
    assert env["HF_HUB_OFFLINE"] == "1"
    # The image's workers run as a user of their own: what the start saved is readable by all.
    assert (forward_dir(lm, cpu_flags()) / "decode.graph").stat().st_mode & 0o444 == 0o444
    assert lm_compile.without_graphs(tmp_path) == []  # what it saved is found: nothing to compile
    shutil.rmtree(forward_dir(lm, cpu_flags()))
    assert lm_compile.compile_store(tmp_path) == 1  # a failed start stops the image's build
    assert "inductor/lm: its worker's start failed (exit 1); the end of its output:" in capsys.readouterr().err
