"""ITT proven end to end: a real TorchServe whose workers load the kit's collector (kit/itt.py)
through libtorch's ITT static part; every inference call must arrive there as one range."""

from __future__ import annotations

import collections
import itertools
import json

import pytest

from bench.payloads import body_for
from handlers.itt import parse_range_name
from kit.itt import chrome_trace, read_ranges
from kit.models import Model
from kit.serve_config import ServeConfig
from tests.e2e.conftest import start_server
from tests.e2e.test_serving import post, worker_pids

pytestmark = pytest.mark.e2e

IMAGES, TEXTS = 7, 5


def test_each_inference_call_is_one_itt_range_in_the_collector(tmp_path):
    itt_dir = tmp_path / "itt"
    # Precompiled, so the workers start in seconds (make test-archives builds MiniLM's aoti-int8, not
    # BERT's). MiniLM on OpenVINO, which carries ITT of its own: only the kit's ranges may be recorded.
    config = ServeConfig.from_preset(
        "optimized",
        variant="aoti-int8",
        models=("resnet50", "minilm"),
        model_variants={"minilm": "openvino-int8"},
        itt_trace_dir=str(itt_dir),
    )
    server = start_server(tmp_path / "run", config)
    try:
        image, text = body_for(Model.load("resnet50")), body_for(Model.load("minilm"))
        for _ in range(IMAGES):
            assert post(server, "resnet50", image.data, image.content_type).status_code == 200
        for _ in range(TEXTS):
            assert post(server, "minilm", text.data, text.content_type).status_code == 200
        # A bad body never reaches the model: no range for it.
        assert post(server, "resnet50", b"not an image", "image/jpeg").status_code == 400
        workers = worker_pids(server, "resnet50") | worker_pids(server, "minilm")
    finally:
        server.stop()

    recorded = read_ranges(itt_dir)
    ranges = [r for r in recorded if parse_range_name(r.name)]  # the kit's own: `<model>:bs<k>`
    # OpenVINO's, oneDNN's and TBB's domains are not recorded (kit/itt_collector.c): TBB alone would
    # add a range per parallel loop, OpenVINO's per node.
    assert recorded == ranges, collections.Counter(r.name for r in recorded if r not in ranges)
    assert collections.Counter(r.name for r in ranges) == {"resnet50:bs1": IMAGES, "minilm:bs1": TEXTS}
    assert {r.pid for r in ranges} <= workers  # recorded inside the worker processes
    for _, thread in itertools.groupby(sorted(ranges, key=lambda r: (r.pid, r.tid)), key=lambda r: (r.pid, r.tid)):
        spans = sorted((r.begin_ns, r.end_ns) for r in thread)
        assert all(begin < end for begin, end in spans)
        assert all(end <= next_begin for (_, end), (next_begin, _) in itertools.pairwise(spans))  # never nested
    events = json.loads(json.dumps(chrome_trace(ranges)))["traceEvents"]
    assert len(events) == IMAGES + TEXTS and all(e["ph"] == "X" and e["dur"] > 0 for e in events)
