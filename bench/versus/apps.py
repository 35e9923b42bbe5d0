"""Served peers: the kit's own OpenVINO IR behind the servers a user would write instead of TorchServe.

    python -m bench.versus.apps fastapi MODEL_DIR --port 8600 --workers 2 --threads 1
    python -m bench.versus.apps litserve MODEL_DIR --port 8600 --workers 2 --threads 1 --batch 4

Both answer POST /predictions/<model> with the same raw body as the kit (JPEG/PNG bytes, UTF-8
text), preprocess it with the kit's handler code (its decode and format: the same answers), and run
the IR of an extracted openvino or openvino-int8 archive with `threads` inference threads per
worker process. Configured as their documentation recommends for CPUs: uvicorn with one worker
process per core; LitServe with one inference worker per core (`workers_per_device`), its default
of as many API server processes, the ZeroMQ queue (`fast_queue`) and optional dynamic batching.
OpenVINO's CPU pinning is off: with one inference thread per process it would pin every process
to the same CPU.

No `from __future__ import annotations` here: LitServe hands decode_request's annotation to
FastAPI as an object, and a string annotation would not resolve there.
"""

import argparse
import os
from pathlib import Path
from typing import Annotated, Any

import litserve as ls
import torch
from fastapi import Body, FastAPI, HTTPException, Request

from bench.plan import Framework
from handlers.archive import archived_handler, read_manifest
from handlers.backends.common import Inputs
from handlers.backends.openvino import IR_FILE, PRECISION_HINT
from handlers.payload import InvalidInput
from handlers.stages import Stage, StageClock, now
from kit.serve_config import ServeConfig

# The fastapi app is built by uvicorn in each worker process (an import string + factory), so
# its arguments travel in the environment.
MODEL_DIR_VAR = "PEER_MODEL_DIR"
THREADS_VAR = "PEER_THREADS"
# Where each process writes the stage times of what it runs (handlers/stages.py), as the kit's
# workers do: the bench compares the two per stage. Unset: kept in memory.
STAGES_DIR_VAR = "PEER_STAGES_DIR"
HOST = "127.0.0.1"
# litserve with batch > 1: waits as long as the kit's batches do
BATCH_TIMEOUT_S = ServeConfig.max_batch_delay_ms / 1000


HEALTH_PATH = {Framework.FASTAPI: "/ping", Framework.LITSERVE: "/health"}


class PeerModel:
    """An archive's IR compiled for this CPU, with the kit's preprocessing and answer format; the
    decode, model and format stages timed as the kit's workers time theirs."""

    def __init__(self, model_dir: Path, threads: int):
        import openvino as ov

        # The kit's preprocessing runs a few torch ops: torch's default of one OpenMP thread per
        # core in every worker process would spin on the other workers' cores.
        torch.set_num_threads(threads)
        self.handler = archived_handler(model_dir)
        self.name = read_manifest(model_dir)["model"]["modelName"]
        config = {
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": PRECISION_HINT[self.handler.settings.dtype],
            "ENABLE_CPU_PINNING": False,
        }
        core = ov.Core()
        self.request = core.compile_model(str(model_dir / IR_FILE), "CPU", config).create_infer_request()
        stages_dir = os.environ.get(STAGES_DIR_VAR)
        self.stages = StageClock(self.name, Path(stages_dir) if stages_dir else None)

    def decode(self, body: bytes) -> Inputs:
        start = now()
        try:
            return self.handler.decode({"body": body})
        finally:
            self.stages.record(Stage.DECODE, start, now(), 1)

    def predict(self, items: list[Inputs]) -> list[Any]:
        start = now()
        # Batched as the kit's handler batches (its collate): text at its length bucket, as the
        # IR's dynamic length allows any framework to.
        arrays = [t.numpy() for t in self.handler.collate(items, len(items))]
        outputs = self.request.infer(arrays)[0]
        inferred = now()
        answers = [self.handler.format(torch.from_numpy(row.copy())) for row in outputs]
        self.stages.record(Stage.MODEL, start, inferred, len(items))
        self.stages.record(Stage.FORMAT, inferred, now(), len(items))
        return answers


def fastapi_app():
    """The plain app: the model runs inline in the event loop (one process per core: a thread
    pool hop would only add latency)."""
    model = PeerModel(Path(os.environ[MODEL_DIR_VAR]), int(os.environ[THREADS_VAR]))
    app = FastAPI()

    @app.get(HEALTH_PATH[Framework.FASTAPI])
    def ping() -> dict:
        return {"status": "Healthy"}

    @app.post(f"/predictions/{model.name}")
    async def predict(request: Request) -> Any:
        body = await request.body()
        try:
            inputs = model.decode(body)
        except InvalidInput as error:
            raise HTTPException(400, str(error)) from None
        return model.predict([inputs])[0]

    return app


def run_fastapi(model_dir: Path, port: int, workers: int, threads: int, batch: int) -> None:
    import uvicorn

    if batch != 1:
        raise SystemExit("the fastapi peer serves one request per call (batch 1)")
    os.environ[MODEL_DIR_VAR], os.environ[THREADS_VAR] = str(model_dir), str(threads)
    uvicorn.run(
        "bench.versus.apps:fastapi_app",
        factory=True,
        host=HOST,
        port=port,
        workers=workers,
        log_level="warning",
        access_log=False,
    )


class PeerAPI(ls.LitAPI):
    """decode_request takes the raw body (bytes): LitServe's default would parse JSON. A module
    level class: LitServe spawns its inference workers and pickles the API object."""

    def __init__(self, model_dir: Path, threads: int, batch: int):
        super().__init__(
            max_batch_size=batch,
            batch_timeout=BATCH_TIMEOUT_S if batch > 1 else 0.0,
            api_path=f"/predictions/{read_manifest(model_dir)['model']['modelName']}",
        )
        self.model_dir, self.threads = model_dir, threads

    def setup(self, device: str) -> None:
        self.model = PeerModel(self.model_dir, self.threads)

    def decode_request(self, request: Annotated[bytes, Body()]) -> Inputs:
        try:
            return self.model.decode(request)
        except InvalidInput as error:
            raise HTTPException(400, str(error)) from None

    def batch(self, inputs: list[Inputs]) -> list[Inputs]:
        return inputs

    def predict(self, x: Inputs | list[Inputs]) -> Any:
        return self.model.predict(x) if self.max_batch_size > 1 else self.model.predict([x])[0]

    def unbatch(self, output: list[Any]) -> list[Any]:
        return output

    def encode_response(self, output: Any) -> Any:
        return output


def run_litserve(model_dir: Path, port: int, workers: int, threads: int, batch: int) -> None:
    api = PeerAPI(model_dir, threads, batch)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=workers, fast_queue=True, timeout=30)
    server.run(host=HOST, port=port, log_level="warning", generate_client_file=False)


RUN = {Framework.FASTAPI: run_fastapi, Framework.LITSERVE: run_litserve}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", type=Framework)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    RUN[args.framework](args.model_dir, args.port, args.workers, args.threads, args.batch)
