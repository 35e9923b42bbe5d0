"""Served peer rows: a peer server (bench/versus/apps.py) started on the kit's IR, measured with the
same warm-up, payload and ab run as the kit's rows, and stopped (its whole process group).

    result = run_served_peer(ServedPeer(Framework.LITSERVE, DType.INT8, 4), "mine", payload, run, out_dir)

One worker process per usable core (the CPU set, capped by the cgroup quota) with one inference
thread each (what both frameworks' documentation recommends for CPUs); the row's CPU ms per request counts every process of the peer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import requests

from bench.ab import measure_ab, warm_up
from bench.payloads import Payload
from bench.plan import RunSettings, ServedPeer
from bench.results import RowResult
from bench.versus.apps import BATCH_TIMEOUT_S, HEALTH_PATH, HOST, STAGES_DIR_VAR
from handlers.stages import difference, merge, read_stage_files, summarize
from kit.footprint import measure_live
from kit.paths import ROOT, process_environment
from kit.ports import PORTS, PortInUseError, bind_failure, start_on_fresh_ports
from kit.procinfo import busy_fractions, cpu_times, process_tree, terminate
from kit.topology import read_topology
from kit.variant import Variant

READY_DEADLINE_S = 300  # both frameworks load the IR in each worker: seconds here
STOP_TIMEOUT_S = 20
PEER_GROUP = "peer server"  # every process of the peer: its own API/worker split is not the kit's


class PeerServer:
    def __init__(self, peer: ServedPeer, model: str, log_path: Path):
        self.peer, self.log_path, self.model = peer, log_path, model
        # Its processes' stage times (bench/versus/apps.py), beside its log; a fresh directory per start.
        self.stages_dir = log_path.parent / "stages" / log_path.stem
        self.model_dir = Variant.load(peer.variant).archive(model)
        # One single-threaded worker per core this process may use (CPU set and quota), as the kit's plan.
        self.workers = read_topology().capacity
        (self.port,) = PORTS.take(1)
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0  # time.monotonic() of start

    def url(self, path: str) -> str:
        return f"http://{HOST}:{self.port}{path}"

    def start(self) -> None:
        self.started_at = time.monotonic()
        command = [
            sys.executable,
            "-m",
            "bench.versus.apps",
            self.peer.framework.value,
            str(self.model_dir),
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
            "--threads",
            "1",
            "--batch",
            str(self.peer.batch_size),
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.stages_dir, ignore_errors=True)
        env = process_environment({**os.environ, STAGES_DIR_VAR: str(self.stages_dir)})
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_DEADLINE_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.log_path.read_text(errors="replace")
                if taken := bind_failure(log):
                    raise PortInUseError(f"{self.peer.name} could not bind port {self.port} ({taken})")
                raise RuntimeError(f"{self.peer.name} exited with {self.process.returncode}; its log:\n{log[-1500:]}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.url(HEALTH_PATH[self.peer.framework]), timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"{self.peer.name} not ready within {READY_DEADLINE_S} s; see {self.log_path}")

    def stage_times(self):
        """The peer's stage histograms so far, all its processes merged (empty before the first flush)."""
        return merge(read_stage_files(self.stages_dir)).get(self.model, {})

    def process_tree(self):
        return process_tree(self.process.pid if self.process else None)

    def stop(self) -> None:
        """Every process of the peer, the frameworks' spawned workers included (they can outlive
        their parent and would steal CPU from the next row), as kit.server stops TorchServe's."""
        if self.process is not None:
            terminate(self.process_tree(), STOP_TIMEOUT_S)
            self.process.wait(timeout=10)


def row_name(peer: ServedPeer, run: RunSettings) -> str:
    payload = f" payload={peer.payload}" if peer.payload else ""
    return f"{peer.name} c={peer.concurrency or run.concurrency}{payload}"


def peer_log(peer: ServedPeer, model: str, run: RunSettings, out_dir: Path) -> Path:
    return out_dir / "servers" / f"{model}-{row_name(peer, run).replace(' ', '-')}.log"


def run_served_peer(peer: ServedPeer, model: str, payload: Payload, run: RunSettings, out_dir: Path) -> RowResult:
    concurrency = peer.concurrency or run.concurrency
    name = row_name(peer, run)
    log_path = peer_log(peer, model, run, out_dir)
    server = start_on_fresh_ports(lambda: PeerServer(peer, model, log_path), PeerServer.wait_ready, keep=log_path)
    try:
        ready_s = time.monotonic() - server.started_at
        url = server.url(f"/predictions/{model}")
        warm_up(url, {}, payload, concurrency, run)
        cpu_before, stages_before = cpu_times(), server.stage_times()
        result, argv, cpu_ms = measure_ab(
            url, {}, payload, concurrency, run.seconds, server.process_tree, lambda process: PEER_GROUP
        )
        busy = busy_fractions(cpu_before, cpu_times())
        stages = difference(server.stage_times(), stages_before or None)
        footprints = [f for f in map(measure_live, (p.pid for p in server.process_tree())) if f]
        rss_mb, pss_mb = (sum(getattr(f, size) for f in footprints) / 2**20 for size in ("rss", "pss"))
    finally:
        server.stop()
    return RowResult(
        model=model,
        name=name,
        kind="served_peer",
        variant=peer.variant,
        runtime="openvino",
        precompiled=True,
        precision=peer.precision.value,
        placement="none",
        objective="",
        allocator="default",
        omp_wait_policy="default",
        workers=server.workers,
        threads=1,
        cpus="",
        batch_size=peer.batch_size,
        max_batch_delay_ms=round(1000 * BATCH_TIMEOUT_S) if peer.batch_size > 1 else 0,
        concurrency=concurrency,
        payload=payload.name,
        baseline=False,
        **dataclasses.asdict(result),
        items_per_s=result.requests_per_s,
        start_to_ready_s=round(ready_s, 1),
        ts_inference_ms=None,
        ts_queue_ms=None,
        allocator_loaded=[],
        cpu_affinity=[],
        worker_rss_mb=[round(rss_mb, 1)],
        worker_pss_mb=[round(pss_mb, 1)],
        launcher_rss_mb=0.0,
        worker_count=server.workers,
        ab_command=" ".join(argv),
        cpu_busy={str(cpu): round(fraction, 3) for cpu, fraction in sorted(busy.items())},
        cpu_ms_per_request=cpu_ms,
        stages={stage.value: dataclasses.asdict(s) for stage, s in summarize(stages).items()},
    )
