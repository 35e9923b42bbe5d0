"""Your samples (kit/samples.py): each form read as request bodies, and what does not fit refused by name."""

from __future__ import annotations

import json

import pytest

from bench.payloads import default_payload, write_payload
from handlers.typed_config import SettingsError
from kit.models import Medium, parse_model
from kit.samples import MIN_SAMPLES, read_samples
from tests.conftest import encode_image


def test_each_form_is_a_list_of_request_bodies(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("b.png", "a.jpg", "c.JPEG", "d.jpg"):
        (photos / name).write_bytes(encode_image("RGB", (32, 24)))
    (photos / "notes.md").write_text("not an image: skipped")
    images = read_samples(photos, Medium.IMAGE)
    assert [(b.file_name, b.content_type) for b in images][:3] == [
        ("a.jpg", "image/jpeg"),
        ("b.png", "image/png"),
        ("c.JPEG", "image/jpeg"),
    ]
    lines = tmp_path / "queries.txt"
    lines.write_text("first query\n\n  second  \nthird\nfourth\n")
    assert [b.data for b in read_samples(lines, Medium.TEXT)] == [b"first query", b"second", b"third", b"fourth"]
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([[1.5, 2], {"inputs": [[1], [2]]}, [0, 0], [3, 4]]))
    tensors = read_samples(rows, Medium.TENSOR)
    assert json.loads(tensors[1].data) == {"inputs": [[1], [2]]} and tensors[0].content_type == "application/json"


def test_samples_that_do_not_fit_are_refused_by_name(tmp_path):
    lines = tmp_path / "queries.txt"
    lines.write_text("one\ntwo\n")
    with pytest.raises(SettingsError, match=f"holds 2 sample.*at least {MIN_SAMPLES}"):
        read_samples(lines, Medium.TEXT)
    with pytest.raises(SettingsError, match="does not fit image models: give a directory of images"):
        read_samples(lines, Medium.IMAGE)
    with pytest.raises(SettingsError, match="does not exist"):
        read_samples(tmp_path / "nope.txt", Medium.TEXT)
    broken = tmp_path / "rows.json"
    broken.write_text("[1, 2")
    with pytest.raises(SettingsError, match="is not JSON"):
        read_samples(broken, Medium.TENSOR)
    broken.write_text(json.dumps([1, 2, 3, 4]))
    with pytest.raises(SettingsError, match="a text model's samples are strings"):
        read_samples(broken, Medium.TEXT)


def test_the_bench_sends_a_model_its_own_sample(tmp_path):
    lines = tmp_path / "queries.txt"
    lines.write_text("where is my parcel\nrefund please\nopening hours\nchange my address\n")
    source = {"source": {"huggingface": "/data/m"}, "task": "text-classification"}
    mine = parse_model("mine", {**source, "samples": str(lines)})
    assert default_payload(mine) == "sample" and default_payload(parse_model("other", source)) == "typical"
    payload = write_payload("sample", mine, tmp_path / "payloads")
    assert payload.path.read_bytes() == b"where is my parcel"
    with pytest.raises(SettingsError, match="payload 'sample' needs samples of other's own"):
        write_payload("sample", parse_model("other", source), tmp_path / "payloads")
