"""A ServeConfig as TorchServe reads it: config.properties from its template, the launcher's
arguments, the frontend's JVM options and the workers' environment.

    text = render(config, model_store, layout)   # logs/config.properties (kit/server.py)

Rendering only: what the configuration means, and its checks, are kit/serve_config.py's.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path
from typing import Any

from handlers.switches import model_settings_environment
from kit.itt import collector_environment
from kit.layout import Allocator, Layout, OmpWaitPolicy
from kit.paths import CONFIG
from kit.serve_config import Placement, ServeConfig

TEMPLATE = CONFIG / "config.properties.template"
LAUNCHER_ALLOCATOR_FLAG = {
    Allocator.DEFAULT: "--use_default_allocator",
    Allocator.JEMALLOC: "--enable_jemalloc",
    Allocator.TCMALLOC: "--enable_tcmalloc",
}
COMMON_POOL = "-Djava.util.concurrent.ForkJoinPool.common.parallelism"  # common_pool_threads


def launcher_args(config: ServeConfig) -> str:
    """TorchServe's cpu_launcher arguments (placement launcher)."""
    # The frontend appends --ninstances/--rank itself when a model has several workers.
    # One allocator for every worker: __post_init__ refuses models that would need two.
    args = ["--disable_iomp", LAUNCHER_ALLOCATOR_FLAG[config.allocator_of(config.models[0])]]
    if config.threads is not None:
        args += ["--ncores-per-instance", str(config.threads)]
        if (config.workers or 1) == 1:
            # Without this the launcher would start cores/threads instances for one worker.
            args += ["--ninstances", "1", "--rank", "0"]
    return " ".join(args)


def models_json(config: ServeConfig, layout: Layout | None = None) -> str:
    models = {}
    for name in config.models:
        entry: dict[str, Any] = {
            "defaultVersion": True,
            "marName": name,  # a directory of the store: served in place, not unzipped
            "batchSize": config.batch_size,
            "maxBatchDelay": config.max_batch_delay_ms,
        }
        workers = len(layout.models[name].workers) if layout else config.workers
        if workers is not None:
            entry.update(minWorkers=workers, maxWorkers=workers)
        models[name] = {"1.0": entry}
    return json.dumps(models, separators=(",", ":"))


def render(config: ServeConfig, model_store: Path, layout: Layout | None = None) -> str:
    values = {
        "bind": config.bind,
        "management_bind": config.management_bind,
        "inference_port": config.inference_port,
        "management_port": config.management_port,
        "metrics_port": config.metrics_port,
        "grpc_inference_port": config.grpc_inference_port,
        "grpc_management_port": config.grpc_management_port,
        "worker_port": config.worker_port,
        "model_store": model_store,
        # Absolute: TorchServe tries a name as a directory relative to its working directory (the
        # run directory, which holds logs/ and model_store/) before the model store.
        "load_models": ",".join(str(model_store / name) for name in config.models),
        "models_json": models_json(config, layout),
        "default_workers": "" if config.workers is None else config.workers,
        "disable_token_auth": str(not config.token_auth_enabled).lower(),
        "launcher": str(config.placement is Placement.LAUNCHER).lower(),
        "launcher_args": launcher_args(config) if config.placement is Placement.LAUNCHER else "",
        "max_request_bytes": config.max_request_mb * 1024 * 1024,
        "vmargs": jvm_args(config, layout),
        # A Java regex quoting the store path literally; .properties files unescape `\\` to `\`.
        "allowed_urls": rf"file://\\Q{model_store}\\E/.*",
    }
    text = string.Template(TEMPLATE.read_text()).substitute(values)
    # A property left empty means "TorchServe's default": drop the line instead of passing "".
    return "".join(line for line in text.splitlines(keepends=True) if not line.rstrip().endswith("="))


def jvm_args(config: ServeConfig, layout: Layout | None) -> str:
    """The preset's JVM options, with the heap the memory plan gave the frontend unless they set one
    (the JVM's own default is a quarter of the cgroup's limit, sized for nothing else running), and
    the common pool's size unless they set it or leave the JVM to its own choices ("", TorchServe
    as shipped: the baseline preset)."""
    args = [config.frontend_jvm_args] if config.frontend_jvm_args else []
    if layout is not None and layout.memory is not None and "-Xmx" not in config.frontend_jvm_args:
        args.append(f"-Xmx{layout.memory.frontend_heap // 2**20}m")
    if config.frontend_jvm_args and COMMON_POOL not in config.frontend_jvm_args:
        cpus = len(layout.frontend_cpus) if layout is not None else len(os.sched_getaffinity(0))
        args.append(f"{COMMON_POOL}={common_pool_threads(cpus)}")
    return " ".join(args)


def common_pool_threads(cpus: int) -> int:
    """The JVM's own size for its common pool (its CPUs less one), at least 2. TorchServe sends a
    worker each message from a task of that pool (WorkerThread, CompletableFuture.runAsync): a
    step of a language model under continuousBatching, a batch otherwise. A pool of one is no
    pool to the JVM: it starts a thread for every task instead (CompletableFuture's
    ThreadPerTaskExecutor), a thread a token on a frontend of 2 CPUs (a 2-core machine, or a
    reserved core of a bigger one). Llama-3.2-1B's shape streaming to one client on a 2-core Xeon
    (scratch runs, 3 each in turns): 453 threads started in 40 s (JFR), and the frontend's CPU
    2.3-2.5 % of a core against 1.7 % with a pool of 2."""
    return max(2, cpus - 1)


def worker_environment(config: ServeConfig) -> dict[str, str]:
    """Environment for the server; the frontend passes it on to every worker."""
    env = {}
    if config.placement is Placement.NONE and config.threads is not None:
        env["OMP_NUM_THREADS"] = str(config.threads)  # the launcher and kit/pin_worker.py set it per worker
    if config.omp_wait_policy is not OmpWaitPolicy.DEFAULT:
        env["OMP_WAIT_POLICY"] = config.omp_wait_policy.value.upper()
    env.update(config.diagnostics.environment())
    env.update(model_settings_environment(config.model_settings))
    if config.itt_trace_dir:
        env.update(collector_environment(Path(config.itt_trace_dir)))
    return env
