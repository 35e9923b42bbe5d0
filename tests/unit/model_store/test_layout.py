"""model_store/layout.py: an archive as it lies on disk."""

from __future__ import annotations

import shutil


def test_an_archive_is_a_directory_torchserve_serves_in_place(tmp_path):
    """torch-model-archiver's directory form, renamed into place: a rebuild replaces it whole and
    leaves no partial one beside it."""
    from handlers.archive import archived_settings, read_manifest
    from handlers.archive_files import MODEL_CONFIG, is_archive
    from kit.paths import ROOT
    from model_store.layout import pack

    store = tmp_path / "store"
    store.mkdir()

    def build(weights: str) -> None:
        files = tmp_path / f"files-{weights}"
        files.mkdir()
        (files / "weights.bin").write_text(weights)
        (files / "weights.bin").chmod(0o600)  # as safetensors saves a checkpoint
        config = tmp_path / MODEL_CONFIG
        config.write_text("handler:\n  architecture: exported-program\n  backend: eager\n")
        pack("tiny", ROOT / "handlers" / "image_classification.py", files, config, store)

    build("first")
    archive = store / "tiny"
    assert is_archive(archive) and read_manifest(archive)["model"]["modelName"] == "tiny"
    assert read_manifest(archive)["model"]["handler"] == "image_classification.py"
    assert (archive / "weights.bin").read_text() == "first" and (archive / "handlers" / "base.py").is_file()
    assert archived_settings(archive).backend.value == "eager"
    assert (archive / "weights.bin").stat().st_mode & 0o777 == 0o644  # the image's non-root workers read it
    build("second")
    assert (archive / "weights.bin").read_text() == "second"
    assert sorted(path.name for path in store.iterdir()) == ["tiny"]


def test_a_models_archives_share_their_identical_large_files_as_links(tmp_path):
    """Each archive is built whole; what another variant's archive of the model already holds at
    the same path with the same bytes is then linked, not kept twice. Small files, and large
    ones that differ, stay the archive's own."""
    from model_store.layout import SHARED_MIN_BYTES, share_identical

    weights, other = b"w" * SHARED_MIN_BYTES, b"x" * SHARED_MIN_BYTES
    archives = {}
    for variant, (checkpoint, compiled) in {"eager": (weights, None), "openvino": (weights, other)}.items():
        archive = archives[variant] = tmp_path / variant / "mine"
        archive.mkdir(parents=True)
        (archive / "model.pt").write_bytes(checkpoint)
        (archive / "small.json").write_text("{}")
        (archive / "model.bin").write_bytes(compiled or weights)  # same size, other bytes in one
    eager, openvino = archives["eager"], archives["openvino"]

    assert share_identical(openvino, [eager, openvino]) == SHARED_MIN_BYTES
    assert (openvino / "model.pt").stat().st_ino == (eager / "model.pt").stat().st_ino
    assert (openvino / "model.pt").read_bytes() == weights
    assert (openvino / "model.bin").stat().st_ino != (eager / "model.bin").stat().st_ino  # differing bytes
    assert (openvino / "small.json").stat().st_ino != (eager / "small.json").stat().st_ino
    assert sorted(path.name for path in openvino.iterdir()) == ["model.bin", "model.pt", "small.json"]
    assert share_identical(openvino, [eager]) == 0  # already one file
    # A rebuild replaces the directory, never writes in place: the other archive keeps its bytes.
    shutil.rmtree(eager)
    assert (openvino / "model.pt").read_bytes() == weights
