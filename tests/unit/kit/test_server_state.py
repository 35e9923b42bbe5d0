"""kit/server_state.py: the one model store a server serves from."""

from __future__ import annotations

from kit.server_state import link_store


def test_a_servers_store_links_each_archive_directory_in_place(tmp_path):
    archives = {}
    for variant, model in [("inductor", "bert"), ("openvino", "resnet50")]:
        archive = tmp_path / "model_store" / variant / model
        archive.mkdir(parents=True)
        (archive / "weights.bin").write_text(model)
        archives[model] = archive
    store = tmp_path / "run" / "model_store"
    store.mkdir(parents=True)
    (store / "stale").mkdir()  # an earlier start's store: replaced
    link_store(archives, store)
    assert sorted(path.name for path in store.iterdir()) == ["bert", "resnet50"]
    assert (store / "resnet50").resolve() == archives["resnet50"]  # served in place, not a copy
    assert (store / "bert" / "weights.bin").read_text() == "bert"
    link_store(archives, store)  # a restart: the links replaced, the archives untouched
    assert (archives["bert"] / "weights.bin").read_text() == "bert"
