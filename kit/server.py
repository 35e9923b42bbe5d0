"""Start, wait for and stop one TorchServe instance that the kit owns: its process lifecycle.

    server = Server(ServeConfig.from_preset("optimized"), run_dir=Path("logs"))
    server.start(); server.wait_ready(deadline_s=900); ...; server.stop()
    server.api.url("inference", "/predictions/mine")     # its APIs (kit/server_api.py)
    server.logs.tail(server.logs.model_log)               # its logs (kit/server_logs.py)

Each instance lives in its own run directory (config, logs, TMPDIR, token key file, state),
so tests and benchmarks can run servers side by side on free ports; `stop` kills only the
process group this instance started.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import requests

from handlers.archive_files import is_archive
from handlers.stages import Histogram, Stage, merge, read_stage_files, stage_table
from handlers.switches import STAGES_DIR
from kit import openai_router
from kit.footprint import measure, record
from kit.kv_cache import served_sequences
from kit.launch import LAYOUT_FILE, Launch
from kit.layout import Layout
from kit.metrics_text import engine_table
from kit.models import STARTUP_TIMEOUT_S
from kit.paths import INDUCTOR_CACHE
from kit.ports import PortInUseError, bind_failure, start_on_fresh_ports
from kit.procinfo import listening_ports, process_alive, process_tree, terminate
from kit.properties import render
from kit.serve_config import Placement, ServeConfig, free_ports_config
from kit.server_api import ServerApi
from kit.server_logs import OomWatch, RunLogs, wait_until_unchanged
from kit.server_state import STATE_FILE, ServerState, link_store
from kit.topology import read_topology

# Cold Inductor compiles of every worker on a few cores; a Kubernetes startupProbe allows as long.
START_DEADLINE_S = STARTUP_TIMEOUT_S
# How often a start asks the management API whether every worker is READY: a second left half a
# second on average to each start; a question is a small request per model to the frontend.
READY_POLL_S = 0.25
# TorchServe's CPU launcher: with placement launcher it stays as every worker's parent.
LAUNCHER_MODULE = "torch.backends.xeon.run_cpu"
MIXED_STORE = "model_store"  # in the run dir: the archives of a config whose models use different variants


class ServerError(RuntimeError):
    """The server did not start, become ready or stop; the message says where to look."""


class PortTakenError(ServerError, PortInUseError):
    """TorchServe exited at start because a port it was given was taken (start_ready retries)."""


class Server:
    def __init__(
        self,
        config: ServeConfig,
        run_dir: Path,
        model_store: Path | None = None,
        pid: int | None = None,
        layout: Layout | None = None,
    ):
        self.config = config
        self.run_dir = Path(run_dir).resolve()
        # Models of different variants (model_variants): a store of their archives, made at start.
        self.own_store = model_store is None and config.mixed_variants
        default_store = self.run_dir / MIXED_STORE if self.own_store else config.variant.store
        self.model_store = (model_store or default_store).resolve()
        self.pid = pid  # the `torchserve --foreground` process; None until started
        self.venv = config.variant.environment
        self.layout = layout  # placement plan: planned at start from the machine as this process sees it
        self.logs = RunLogs(self.run_dir)
        self.api = ServerApi(config, self.run_dir)
        self.started_at: float | None = None  # time.monotonic() of the last start
        self.oom = OomWatch()  # set at start: to say why workers died once they are gone
        self.router_pid: int | None = None  # the OpenAI router's, started with TorchServe

    @property
    def stages_dir(self) -> Path:
        return self.run_dir / STAGES_DIR  # each worker's stage histograms (handlers/stages.py)

    def stage_times(self) -> dict[str, dict[Stage, Histogram]]:
        """Per model, its workers' stage histograms so far (each worker's within a second)."""
        return merge(read_stage_files(self.stages_dir))

    def numbers(self) -> list[tuple[str, list[str]]]:
        """The workers' own numbers as tables (make status), each with its title; none empty."""
        tables = [
            ("where the workers' time goes, per stage of a call, since start", stage_table(self.stage_times())),
            (
                "the language models' requests since start, and now (the router's /metrics)",
                engine_table(self.stages_dir),
            ),
        ]
        return [(title, lines) for title, lines in tables if lines]

    @classmethod
    def from_state(cls, run_dir: Path) -> Server | None:
        """The server a previous `start` left in run_dir, if its state file is there."""
        state = ServerState.load(Path(run_dir))
        if state is None:
            return None
        server = cls(state.config, run_dir, state.model_store, state.pid, state.layout)
        server.oom, server.router_pid = state.oom, state.router_pid
        return server

    def is_running(self) -> bool:
        return self.pid is not None and process_alive(self.pid)

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def tmp_dir(self) -> Path:
        # Worker sockets live here and AF_UNIX paths max out at 107 bytes: keep it short, yet
        # derived from run_dir so a later `stop` finds it.
        digest = hashlib.sha1(str(self.run_dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"kit-{digest}"

    @property
    def launch(self) -> Launch:
        return Launch(self.config, self.venv, self.run_dir, self.tmp_dir, self.layout)

    def start(self) -> int:
        if self.is_running():
            raise ServerError(f"already running (pid {self.pid}); stop it first")
        archives = (
            self.config.archives()
            if self.own_store
            else {model: self.model_store / model for model in self.config.models}
        )
        missing = [str(path) for path in archives.values() if not is_archive(path)]
        if missing:
            variants = ",".join(sorted({self.config.variant_of(model).name for model in self.config.models}))
            raise ServerError(f"no archive {', '.join(missing)}; run `make archive VARIANTS={variants}`")
        if not (self.venv / "bin" / "torchserve").is_file():
            raise ServerError(
                f"variant {self.config.variant.name!r} is served from {self.venv}, which is not built; "
                "run `make install-ipex`"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        if self.own_store:
            link_store(archives, self.model_store)
        INDUCTOR_CACHE.mkdir(parents=True, exist_ok=True)
        self.layout = self.config.layout(read_topology()) if self.config.placement is Placement.PLAN else None
        if self.layout:
            (self.run_dir / LAYOUT_FILE).write_text(json.dumps(self.layout.to_dict(), indent=2))
            shutil.rmtree(self.run_dir / "slots", ignore_errors=True)  # a previous run's worker slots
        shutil.rmtree(self.stages_dir, ignore_errors=True)  # a previous run's workers' stage times
        config_file = self.run_dir / "config.properties"
        config_file.write_text(render(self.config, self.model_store, self.layout))
        self.logs.mark()
        self.started_at = time.monotonic()
        self.oom = OomWatch.at_start()
        with open(self.logs.output_file, "ab") as output:
            process = subprocess.Popen(
                self.launch.command(config_file, self.model_store),
                cwd=self.run_dir,
                env=self.launch.environment(),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = process.pid
        try:
            router = openai_router.start(
                self.config, self.run_dir, self.api.url("inference", ""), self.api.url("metrics", "/metrics")
            )
        except Exception:
            self.stop()  # TorchServe is up: a failed start leaves nothing running
            raise
        self.router_pid = router and router.pid
        ServerState(process.pid, self.config, self.model_store, self.layout, self.oom, self.router_pid).save(
            self.run_dir
        )
        return process.pid

    def stop(self, timeout_s: float = 60) -> None:
        """SIGTERM the server and every descendant, SIGKILL what is left at the deadline (the
        frontend as soon as it has closed its ports and the rest is gone: closed_frontend).

        Workers call setsid(), so the process group alone would miss them: walk the tree. A
        worker the frontend restarted while it was stopping is in no tree: find it by its socket
        directory, once the frontend is gone.
        """
        if self.pid is None:
            return
        tree = self.process_tree() + (process_tree(self.router_pid) if self.router_pid else [])
        terminate(tree, timeout_s, idle=closed_frontend)
        terminate(self.stray_workers(), timeout_s)
        (self.run_dir / STATE_FILE).unlink(missing_ok=True)
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def stray_workers(self) -> list[psutil.Process]:
        """Live processes of this server outside its tree (their command names its tmp_dir)."""
        marker = str(self.tmp_dir)
        strays = []
        for process in psutil.process_iter(["cmdline"]):
            if any(marker in arg for arg in process.info["cmdline"] or ()):
                strays.append(process)
        return strays

    def launcher_pids(self) -> list[int]:
        """TorchServe's launcher processes (torch.backends.xeon.run_cpu), each a worker's parent."""
        pids = []
        for process in self.process_tree():
            with contextlib.suppress(psutil.Error):
                if LAUNCHER_MODULE in process.cmdline():
                    pids.append(process.pid)
        return pids

    def process_tree(self) -> list[psutil.Process]:
        """The server process and all its descendants (frontend, launchers, workers)."""
        return process_tree(self.pid)

    # -- readiness ----------------------------------------------------------------------------
    def listening_ports(self) -> set[int]:
        """TCP ports a process of this server listens on now (from /proc)."""
        ports = set()
        for process in self.process_tree():
            with contextlib.suppress(psutil.Error):
                ports |= listening_ports(process)
        return ports

    def expected_workers(self, model: str) -> int:
        if self.layout:
            return len(self.layout.models[model].workers)
        # TorchServe's default is one worker per CPU it may use (default_workers_per_model unset).
        return self.config.workers or len(self.config.allowed_cpus)

    def ready_models(self) -> set[str]:
        """Models whose every expected worker reports READY (a loading worker shows UNLOADING)."""
        ready = set()
        for model in self.config.models:
            statuses = self.api.worker_statuses(model)
            if statuses and statuses.count("READY") >= self.expected_workers(model) and set(statuses) == {"READY"}:
                ready.add(model)
        return ready

    def wait_ready(self, deadline_s: float = START_DEADLINE_S, progress=print) -> None:
        """Poll the management API until every worker of every model is READY (/ping is not enough)."""
        start = time.monotonic()
        last_report = ready = None
        while True:
            if not self.is_running():
                logs = self.logs
                if taken := bind_failure(logs.output_since_start()):
                    raise PortTakenError(
                        f"TorchServe could not bind a port it was given ({taken}): another "
                        f"process holds it (`ss -ltnp` names it); see {logs.output_file}"
                    )
                why = "; ".join(filter(None, [logs.exit_reason(), self.oom.note()]))
                raise ServerError(f"TorchServe exited during start-up: {why}; see {logs.output_file}\n{logs.tail()}")
            failures = self.logs.load_failures()
            if failures:
                # The frontend logs the failure while it is still relaying the worker's
                # traceback into the model log: quote that log once it has stopped growing.
                model_log = self.logs.model_log
                wait_until_unchanged(model_log)
                why = "; ".join(filter(None, [failures[-1], self.oom.note()]))
                raise ServerError(f"model load failed: {why}\nsee {model_log}\n{self.logs.tail(model_log)}")
            ready = self.ready_models()
            elapsed = time.monotonic() - start
            # Every API bound too: TorchServe binds them after registering the models, and a
            # server without models has nothing else to wait for.
            if ready == set(self.config.models) and set(self.api.ports.values()) <= self.listening_ports():
                self.wait_router(deadline_s - elapsed)
                progress(f"[serve] all models READY after {elapsed:.0f}s")
                self.record_footprints(progress)
                return
            if elapsed > deadline_s:
                raise ServerError(
                    f"not ready after {deadline_s:.0f}s (ready: {sorted(ready)}); see {self.logs.model_log}\n"
                    f"{self.logs.tail(self.logs.model_log)}"
                )
            if last_report is None or time.monotonic() - last_report > 15:
                waiting = sorted(set(self.config.models) - ready)
                progress(f"[serve] {elapsed:4.0f}s waiting for {waiting} (loading, compiling, warming up)")
                last_report = time.monotonic()
            time.sleep(READY_POLL_S)

    def wait_router(self, deadline_s: float) -> None:
        """The OpenAI router answers (it starts in a second); its exit is a start-up failure."""
        if self.router_pid is None:
            return
        log = self.run_dir / openai_router.LOG_FILE
        end = time.monotonic() + max(deadline_s, 10)
        while True:
            if not process_alive(self.router_pid):
                text = log.read_text(errors="replace") if log.is_file() else ""
                if taken := bind_failure(text):
                    raise PortTakenError(
                        f"the OpenAI router could not bind port {self.config.openai_port} ({taken}); see {log}"
                    )
                raise ServerError(f"the OpenAI router exited during start-up; see {log}\n{text[-2000:]}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.api.openai_url("/health"), timeout=2).ok:
                    return
            if time.monotonic() > end:
                raise ServerError(f"the OpenAI router did not answer on port {self.config.openai_port}; see {log}")
            time.sleep(0.2)

    def sequences_of(self, model: str, archive: Path) -> int:
        """The KV cache's contexts each of the model's workers holds: the plan's, else its archive's."""
        if self.layout and model in self.layout.models:
            return self.layout.models[model].kv_contexts
        sequences = served_sequences(model, archive)
        return sequences.most if sequences else 0

    def record_footprints(self, progress=print) -> None:
        """Measure every model's warmed workers and record it beside its archive, for the next plan."""
        workers: dict[str, list[int]] = {}
        for worker in self.api.workers():
            if worker.process:
                workers.setdefault(worker.model, []).append(worker.process.pid)
        for model, pids in workers.items():
            archive = (self.model_store / model).resolve()
            try:
                measured = [measure(pid) for pid in pids]
                footprint = record(archive, self.config.batch_size, measured, self.sequences_of(model, archive))
            except PermissionError:  # an image's store is read-only to its user: not an error
                progress(f"[serve] {model}: memory not recorded: {archive.parent} is read-only to this user")
                continue
            except OSError as error:  # a worker gone meanwhile: the next start measures
                progress(f"[serve] {model}: memory not recorded ({error})")
                continue
            progress(f"[serve] {model} memory: {footprint.summary()}")


def closed_frontend(process: psutil.Process) -> bool:
    """A TorchServe frontend that has closed its ports after a SIGTERM: what it does next is wait
    out netty's 2-second quiet period with nothing left to serve (2-3 s of each stop), so a stop
    kills it then, its workers gone."""
    return process.name() == "java" and not listening_ports(process)


def start_ready(
    config: ServeConfig,
    run_dir: Path,
    deadline_s: float = START_DEADLINE_S,
    progress=print,
    model_store: Path | None = None,
) -> Server:
    """A READY server of `config` on ports picked for it (kit/ports.py): what the bench, soak and
    tests start. A start that lost a port to another process is retried on fresh ports; the
    failed start's run directory is kept beside, as `<run_dir>.attempt-<n>`."""
    return start_on_fresh_ports(
        lambda: Server(free_ports_config(config), run_dir, model_store),
        lambda server: server.wait_ready(deadline_s, progress),
        keep=Path(run_dir),
        progress=progress,
    )
