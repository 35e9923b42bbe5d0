"""handlers/diagnostics.py: the profile of a worker's first requests."""

from __future__ import annotations

import json

from tests.conftest import encode_image
from tests.unit.handlers.serving import image_handler, serve, statuses


def test_profile_switch_records_the_first_requests_only(image_archive, tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_PROFILE_REQUESTS", "2")
    monkeypatch.setenv("LOG_LOCATION", str(tmp_path / "logs"))
    handler, context = image_handler(image_archive, backend="eager")
    request = [{"body": encode_image("RGB", (40, 40))}]
    serve(handler, context, request)
    assert not (tmp_path / "logs" / "profile").exists()  # written once N calls are recorded
    serve(handler, context, request)
    (trace,) = (tmp_path / "logs" / "profile").glob("tiny-pid*.json")
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(event.get("name", "").startswith("aten::conv") for event in events)
    assert (tmp_path / "logs" / "profile" / f"{trace.stem}-top20.txt").is_file()
    serve(handler, context, request)  # after N: served as usual, nothing more recorded
    assert statuses(context) == [200] and len(list((tmp_path / "logs" / "profile").iterdir())) == 2
