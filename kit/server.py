"""Start, wait for, inspect and stop one TorchServe instance that the kit owns.

    server = Server(ServeConfig.from_preset("optimized"), run_dir=Path("logs"))
    server.start(); server.wait_ready(deadline_s=900); ...; server.stop()

Each instance lives in its own run directory (config, logs, TMPDIR, token key file, state),
so tests and benchmarks can run servers side by side on free ports; `stop` kills only the
process group this instance started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

from handlers.settings import Backend, parse_settings
from kit.procinfo import ProcessInfo, inspect_process
from kit.serve_config import ROOT, Allocator, ServeConfig, render, worker_environment

VENV = ROOT / ".venv"
IPEX_VENV = ROOT / ".venv-ipex"  # torch 2.8 + IPEX: `make install-ipex`
# Backends that only run in the IPEX environment; the archive variant says which backend it uses.
ENVIRONMENT_OF_BACKEND = {Backend.IPEX: IPEX_VENV, Backend.IPEX_COMPILE: IPEX_VENV}
NO_PRELOADED_ALLOCATOR = {Backend.OPENVINO}  # see compatible()
INDUCTOR_CACHE = ROOT / ".cache" / "inductor"
LOG_CONFIG = ROOT / "config" / "log4j2.xml"
STATE_FILE = "server.json"
KEY_FILE = "key_file.json"  # written by TorchServe into its working directory when token auth is on


class ServerError(RuntimeError):
    """The server did not start, become ready or stop; the message says where to look."""


@dataclasses.dataclass(frozen=True)
class WorkerStatus:
    model: str
    worker_id: str
    status: str  # READY, UNLOADING, ...
    process: ProcessInfo | None  # None while the worker has no live process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports_config(config: ServeConfig) -> ServeConfig:
    """The same layout on ports nobody else is using (tests, benchmarks)."""
    return dataclasses.replace(
        config,
        inference_port=free_port(),
        management_port=free_port(),
        metrics_port=free_port(),
        grpc_inference_port=free_port(),
        grpc_management_port=free_port(),
        # Worker sockets count up from here, one per worker; leave room below 65535.
        worker_port=20000 + (free_port() % 20000),
    )


def variant_backend(variant: str) -> Backend:
    """The backend of config/variants/<variant>.yaml."""
    overlay = ROOT / "config" / "variants" / f"{variant}.yaml"
    raw = (yaml.safe_load(overlay.read_text()) or {}) if overlay.is_file() else {}
    return Backend((raw.get("handler") or {}).get("backend", Backend.INDUCTOR.value))


def python_environment(variant: str) -> Path:
    """The venv that serves archives of `variant`."""
    return ENVIRONMENT_OF_BACKEND.get(variant_backend(variant), VENV)


def compatible(config: ServeConfig) -> ServeConfig:
    """The config with the allocator the variant's backend can run with.

    OpenVINO's CPU plugin frees, with glibc, memory that an LD_PRELOADed tcmalloc or jemalloc
    allocated (it crashes in compile_model with "free(): invalid pointer"), so its workers keep
    glibc malloc whatever the preset says.
    """
    if variant_backend(config.variant) in NO_PRELOADED_ALLOCATOR and config.allocator is not Allocator.DEFAULT:
        return dataclasses.replace(config, allocator=Allocator.DEFAULT)
    return config


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); count it as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def live_process(pid: int | None) -> ProcessInfo | None:
    """What /proc says of a worker pid; None if it is gone (also if it dies while being read)."""
    if not pid or not process_alive(pid):
        return None
    try:
        return inspect_process(pid)
    except OSError:
        return None


class Server:
    def __init__(self, config: ServeConfig, run_dir: Path, model_store: Path | None = None, pid: int | None = None):
        self.config = compatible(config)
        self.run_dir = Path(run_dir).resolve()
        self.model_store = (model_store or ROOT / "model_store" / config.variant).resolve()
        self.pid = pid  # the `torchserve --foreground` process; None until started
        self.venv = python_environment(config.variant)
        # Logs append across runs: start-up checks read only what this run wrote.
        self.log_offset = 0

    # -- files --------------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.run_dir / STATE_FILE

    @property
    def output_file(self) -> Path:
        return self.run_dir / "torchserve.out"

    @property
    def frontend_log(self) -> Path:
        return self.run_dir / "ts_log.log"

    @property
    def model_log(self) -> Path:
        return self.run_dir / "model_log.log"

    @classmethod
    def from_state(cls, run_dir: Path) -> Server | None:
        """The server a previous `start` left in run_dir, if its state file is there."""
        state_file = Path(run_dir) / STATE_FILE
        if not state_file.is_file():
            return None
        state = json.loads(state_file.read_text())
        return cls(parse_settings(ServeConfig, state["config"]), run_dir, Path(state["model_store"]), state["pid"])

    def is_running(self) -> bool:
        return self.pid is not None and process_alive(self.pid)

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def tmp_dir(self) -> Path:
        # Worker sockets live here and AF_UNIX paths max out at 107 bytes: keep it short, yet
        # derived from run_dir so a later `stop` finds it.
        digest = hashlib.sha1(str(self.run_dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"kit-{digest}"

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        tmp = self.tmp_dir
        env.update(
            # The frontend's launcher check runs the bare `python`: the venv must come first.
            PATH=f"{self.venv / 'bin'}:{env.get('PATH', '')}",
            # run_cpu looks for libjemalloc.so / libtcmalloc.so in $VIRTUAL_ENV/lib.
            VIRTUAL_ENV=str(self.venv),
            # TorchServe's pid file, extracted archives and worker sockets go under TMPDIR/TEMP.
            TMPDIR=str(tmp),
            TEMP=str(tmp),
            LOG_LOCATION=str(self.run_dir),
            METRICS_LOCATION=str(self.run_dir),
            # Restarts reuse compiled kernels instead of compiling from scratch.
            TORCHINDUCTOR_CACHE_DIR=str(INDUCTOR_CACHE),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        env.update(worker_environment(self.config))
        return env

    def start(self) -> int:
        if self.is_running():
            raise ServerError(f"already running (pid {self.pid}); stop it first")
        missing = [m for m in self.config.models if not (self.model_store / f"{m}.mar").is_file()]
        if missing:
            raise ServerError(f"{self.model_store} lacks {missing}; run `make archive`")
        if not (self.venv / "bin" / "torchserve").is_file():
            raise ServerError(f"variant {self.config.variant!r} is served from {self.venv}, which is not built; "
                              "run `make install-ipex`")  # fmt: skip
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        INDUCTOR_CACHE.mkdir(parents=True, exist_ok=True)
        config_file = self.run_dir / "config.properties"
        config_file.write_text(render(self.config, self.model_store))
        self.log_offset = self.frontend_log.stat().st_size if self.frontend_log.is_file() else 0
        command = [
            str(self.venv / "bin" / "torchserve"),
            "--start",
            "--foreground",  # we own the process: its group is ours to stop
            "--ncs",  # no config snapshots: every start is exactly the rendered config
            "--ts-config", str(config_file),
            "--model-store", str(self.model_store),
            "--log-config", str(LOG_CONFIG),
        ]  # fmt: skip
        with open(self.output_file, "ab") as output:
            process = subprocess.Popen(
                command,
                cwd=self.run_dir,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = process.pid
        self.state_file.write_text(
            json.dumps(
                {"pid": process.pid, "config": _jsonable(self.config), "model_store": str(self.model_store)},
                indent=2,
            )
        )
        return process.pid

    def stop(self, timeout_s: float = 60) -> None:
        """SIGTERM the server and every descendant, SIGKILL what is left at the deadline.

        Workers call setsid(), so the process group alone would miss them: walk the tree.
        """
        if self.pid is None:
            return
        processes = self.process_tree()
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, alive = psutil.wait_procs(processes, timeout=timeout_s)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=10)
        self.state_file.unlink(missing_ok=True)
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def process_tree(self) -> list[psutil.Process]:
        """The server process and all its descendants (frontend, launchers, workers)."""
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    # -- HTTP ---------------------------------------------------------------------------------
    def keys(self) -> dict[str, str]:
        """Token-auth keys {"management": ..., "inference": ...}; empty when auth is off."""
        key_file = self.run_dir / KEY_FILE
        if not self.config.token_auth_enabled or not key_file.is_file():
            return {}
        raw = json.loads(key_file.read_text())
        return {api: raw[api]["key"] for api in ("management", "inference") if api in raw}

    def headers(self, api: str) -> dict[str, str]:
        key = self.keys().get(api)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def url(self, api: str, path: str) -> str:
        port = {
            "inference": self.config.inference_port,
            "management": self.config.management_port,
            "metrics": self.config.metrics_port,
        }[api]
        bind = self.config.management_bind if api == "management" else self.config.bind
        host = "127.0.0.1" if bind in ("0.0.0.0", "::") else bind
        return f"http://{host}:{port}{path}"

    def describe(self, model: str) -> list[dict[str, Any]]:
        response = requests.get(
            self.url("management", f"/models/{model}"), headers=self.headers("management"), timeout=5
        )
        response.raise_for_status()
        return response.json()

    def workers(self) -> list[WorkerStatus]:
        statuses = []
        for model in self.config.models:
            for version in self.describe(model):
                for worker in version.get("workers", []):
                    process = live_process(worker.get("pid"))
                    statuses.append(WorkerStatus(model, str(worker["id"]), worker["status"], process))
        return statuses

    def scale(self, model: str, workers: int, timeout_s: float = 900) -> None:
        """Set the model's worker count and return once TorchServe has them running (synchronous)."""
        response = requests.put(
            self.url("management", f"/models/{model}?min_worker={workers}&max_worker={workers}&synchronous=true"),
            headers=self.headers("management"),
            timeout=timeout_s,
        )
        response.raise_for_status()

    def expected_workers(self) -> int:
        # TorchServe's default is one worker per core (default_workers_per_model unset).
        return self.config.workers or os.cpu_count() or 1

    def ready_models(self) -> set[str]:
        """Models whose every expected worker reports READY (a loading worker shows UNLOADING)."""
        ready = set()
        for model in self.config.models:
            try:
                versions = self.describe(model)
            except requests.RequestException:
                continue
            statuses = [w.get("status") for v in versions for w in v.get("workers", [])]
            if statuses.count("READY") >= self.expected_workers() and set(statuses) == {"READY"}:
                ready.add(model)
        return ready

    def wait_ready(self, deadline_s: float = 900, progress=print) -> None:
        """Poll the management API until every worker of every model is READY (/ping is not enough)."""
        start = time.monotonic()
        last_report = ready = None
        while True:
            if not self.is_running():
                raise ServerError(f"TorchServe exited during start-up; see {self.output_file}\n{self.tail()}")
            failures = self._load_failures()
            if failures:
                raise ServerError(
                    f"model load failed: {failures[-1]}\nsee {self.model_log}\n{self.tail(self.model_log)}"
                )
            ready = self.ready_models()
            elapsed = time.monotonic() - start
            if ready == set(self.config.models):
                progress(f"[serve] all models READY after {elapsed:.0f}s")
                return
            if elapsed > deadline_s:
                raise ServerError(
                    f"not ready after {deadline_s:.0f}s (ready: {sorted(ready)}); see {self.model_log}\n"
                    f"{self.tail(self.model_log)}"
                )
            if last_report is None or time.monotonic() - last_report > 15:
                waiting = sorted(set(self.config.models) - ready)
                progress(f"[serve] {elapsed:4.0f}s waiting for {waiting} (loading, compiling, warming up)")
                last_report = time.monotonic()
            time.sleep(1)

    # Frontend log lines that mean a worker could not start or load its model. TorchServe would
    # retry with growing back-off for ever; start-up gives up at the first one instead.
    FAILURE_MARKERS = ("Load model failed", "Backend worker process died")

    def _load_failures(self) -> list[str]:
        if not self.frontend_log.is_file():
            return []
        with open(self.frontend_log, "rb") as log:
            log.seek(self.log_offset if log.seek(0, 2) >= self.log_offset else 0)  # 0 after a roll-over
            lines = log.read().decode(errors="replace").splitlines()
        return [line for line in lines if any(marker in line for marker in self.FAILURE_MARKERS)]

    def worker_errors(self, lines: int = 12) -> str:
        """The worker's own traceback tail (the reason), from the model log."""
        if not self.model_log.is_file():
            return f"({self.model_log} does not exist)"
        text = self.model_log.read_text(errors="replace").splitlines()
        errors = [line.split("MODEL_LOG - ", 1)[-1] for line in text if "MODEL_LOG - " in line]
        return "\n".join(errors[-lines:])

    def tail(self, path: Path | None = None, lines: int = 30) -> str:
        path = path or self.output_file
        if not path.is_file():
            return f"({path} does not exist)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _jsonable(config: ServeConfig) -> dict[str, Any]:
    raw = dataclasses.asdict(config)
    return {k: (v.value if hasattr(v, "value") else list(v) if isinstance(v, tuple) else v) for k, v in raw.items()}
