"""Peer rows: the same model in the runtimes a user could pick instead of the kit, in-process.

    measure_peer(Peer(Runtime.OPENVINO, DType.INT8), Variant.load("eager").archive("mine"), 10, work_dir)

Each peer runs in its own child process with every core, the way its documentation suggests
for throughput: ONNX Runtime with intra-op threads = cores, OpenVINO with the THROUGHPUT hint
and as many requests in flight as it asks for. Weights come from the kit's eager archive, so
peers and served rows compute the same function. Accuracy is measured against float32 eager
on held-out samples (handlers/calibration.py), as for the kit's own in-process rows.

Child mode: python -m bench.versus.runtimes MODEL_DIR --runtime openvino --precision int8 --seconds 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.plan import Peer, Runtime
from bench.results import Measured
from handlers.backends import DType
from kit.paths import ROOT, process_environment
from kit.topology import read_topology


def measure_peer(peer: Peer, archive: Path, seconds: int, work_dir: Path) -> Measured:
    work_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "bench.versus.runtimes",
        str(archive),
        "--runtime",
        peer.runtime.value,
        "--precision",
        peer.precision.value,
        "--batch",
        str(peer.batch_size),
        "--seconds",
        str(seconds),
    ]
    env = process_environment(dict(os.environ))
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if completed.returncode != 0:
        raise RuntimeError(f"peer {peer.name} failed: {completed.stderr.strip()[-800:]}")
    return Measured(**json.loads(completed.stdout.strip().splitlines()[-1]))


# -- child side ---------------------------------------------------------------------------------
def _onnxruntime(model, settings, example, calibration, precision: DType, work_dir: Path):
    import onnxruntime as ort
    import torch

    from handlers.backends.common import export_shapes

    if precision is not DType.FLOAT32:
        raise ValueError("the onnxruntime peer runs float32 only")
    path = work_dir / "peer.onnx"
    names = [f"input{i}" for i in range(len(example))]
    dynamic = export_shapes(settings, example, batch=False)
    batch = torch.export.Dim("batch", min=1, max=1024)
    torch.onnx.export(
        model,
        example,
        str(path),
        input_names=names,
        output_names=["output"],
        dynamic_shapes=tuple({0: batch, **dims} for dims in dynamic),
        dynamo=True,
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = read_topology().capacity  # the cores the quota pays for, not the host's
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run(arrays: list):
        return session.run(None, dict(zip(names, arrays, strict=True)))[0]

    return run, None


def _openvino(model, settings, example, calibration, precision: DType, work_dir: Path):
    import openvino as ov

    from handlers.backends.openvino import PRECISION_HINT, convert, quantize_int8

    converted = convert(model, settings, example)
    if precision is DType.INT8:
        converted = quantize_int8(converted, calibration, settings.transformer)
    config = {"PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_PRECISION_HINT": PRECISION_HINT[precision]}
    compiled = ov.Core().compile_model(converted, "CPU", config)
    request = compiled.create_infer_request()

    def run(arrays: list):
        return request.infer(arrays)[0].copy()

    # Throughput mode: as many requests in flight as the plugin asks for.
    queue = ov.AsyncInferQueue(compiled, compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    return run, queue


PEER_BUILDERS = {Runtime.ONNXRUNTIME: _onnxruntime, Runtime.OPENVINO: _openvino}


def run_child(model_dir: Path, runtime: Runtime, precision: DType, batch: int, seconds: int) -> None:
    import numpy as np
    import torch

    from handlers.accuracy import HELD_OUT, agreement
    from handlers.archive import load_archived

    archived = load_archived(model_dir)
    calibration = archived.handler.samples.calibration()
    run, queue = PEER_BUILDERS[runtime](
        archived.model, archived.settings, archived.example(2), calibration, precision, model_dir
    )
    agreed = agreement(
        lambda *inputs: torch.from_numpy(np.asarray(run([t.numpy() for t in inputs]))),
        archived.model,
        archived.handler.samples.held_out(HELD_OUT),
    )

    arrays = [t.numpy() for t in archived.example(batch)]
    for _ in range(3):
        run(arrays)
    items = 0
    start = time.perf_counter()
    if queue is None:
        while time.perf_counter() - start < seconds:
            run(arrays)
            items += batch
    else:
        while time.perf_counter() - start < seconds:
            for _ in range(len(queue)):
                queue.start_async(arrays)
            queue.wait_all()
            items += batch * len(queue)
    elapsed = time.perf_counter() - start
    result = Measured(round(items / elapsed, 2), agreed.cosine_mean, agreed.cosine_min, agreed.top1_agreement)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--runtime", type=Runtime, required=True)
    parser.add_argument("--precision", type=DType, default=DType.FLOAT32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    run_child(args.model_dir, args.runtime, args.precision, args.batch, args.seconds)
