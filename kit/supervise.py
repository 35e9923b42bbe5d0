"""PID 1 of the kit's container image: start, watch and drain one TorchServe (and its auth proxy).

    python -m kit run --config container --key-file /run/secrets/kit/api-key

- TorchServe (and nginx, and the OpenAI router) run as this process's children, in the foreground; as PID 1 it also
  reaps orphans whose parent died (a worker's children), which no one else would.
- `ready` in the run directory exists only while every model has all its workers READY once
  and no stop has begun: `python -m kit probe ready` (the readiness probe) reads it.
- SIGTERM (a pod's deletion, `docker stop`): the ready file goes at once, so the Service stops
  sending; TorchServe keeps serving for `drain_s` (requests the endpoint update has not reached
  yet, and those in flight), nginx then finishes what it holds and TorchServe stops. The pod's
  terminationGracePeriodSeconds must cover drain + stop (deploy/k8s/deployment.yaml: 45 s).
- Exit status: 0 after a signal; 1 when a child dies on its own, so the kubelet restarts the
  container.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from kit import openai_router
from kit.procinfo import process_alive
from kit.proxy import AuthProxy
from kit.server import Server

READY_FILE = "ready"
DRAIN_S = 10  # served after SIGTERM: endpoint updates take a few seconds to reach every proxy
STOP_TIMEOUT_S = 20  # TorchServe's frontend and workers, after the drain
PROXY_STOP_TIMEOUT_S = 10


class Stopping(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)


def raise_stopping(signum: int, frame) -> None:
    raise Stopping(signum)


def reap_orphans() -> None:
    """Collect every exited child: as PID 1 this process inherits the orphans of the tree."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def ready_file(run_dir: Path) -> Path:
    return run_dir / READY_FILE


def watch(server: Server, proxy: subprocess.Popen | None) -> str:
    """Block until TorchServe, the OpenAI router or the proxy exits on its own; say which."""
    while True:
        if proxy is not None and proxy.poll() is not None:
            return f"the auth proxy (nginx) exited with status {proxy.returncode}"
        reap_orphans()
        if not server.is_running():
            return f"TorchServe exited; see {server.logs.output_file}\n{server.logs.tail()}"
        if server.router_pid and not process_alive(server.router_pid):
            return f"the OpenAI router exited; see {server.run_dir / openai_router.LOG_FILE}"
        time.sleep(1)


def stop_proxy(proxy: subprocess.Popen | None) -> None:
    if proxy is None or proxy.poll() is not None:
        return
    proxy.send_signal(signal.SIGQUIT)  # nginx's graceful stop: finish open requests, accept none
    try:
        proxy.wait(PROXY_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proxy.kill()
        proxy.wait()


def run(server: Server, proxy: AuthProxy | None, drain_s: float, deadline_s: float) -> int:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, raise_stopping)
    status = 1
    try:
        status = serve(server, proxy, drain_s, deadline_s)
    finally:
        print(f"[run] stopped (exit status {status})", flush=True)
    return status


def serve(server: Server, proxy: AuthProxy | None, drain_s: float, deadline_s: float) -> int:
    ready = ready_file(server.run_dir)
    ready.unlink(missing_ok=True)
    nginx = None
    try:
        server.run_dir.mkdir(parents=True, exist_ok=True)
        nginx = proxy.start(server.config, server.run_dir) if proxy else None
        pid = server.start()
        print(f"[run] TorchServe pid {pid}, models {', '.join(server.config.models)}; layout in {server.run_dir}")
        server.wait_ready(deadline_s, progress=lambda line: print(line.replace("[serve]", "[run]"), flush=True))
        ready.write_text(f"{time.time():.0f}\n")
        if proxy:
            print(f"[run] serving: inference on :{proxy.inference_port} (bearer key), metrics on :{proxy.metrics_port}")
        print(f"[run] {watch(server, nginx)}", flush=True)
        return 1
    except Stopping as stop:
        if ready.exists():
            ready.unlink()
            print(f"[run] {stop}: not ready any more; serving {drain_s:.0f}s more for requests in flight", flush=True)
            with contextlib.suppress(Stopping):  # a second signal cuts the drain short
                time.sleep(drain_s)
        else:
            print(f"[run] {stop} during start-up: stopping", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop below runs to its end
        ready.unlink(missing_ok=True)
        stop_proxy(nginx)
        server.stop(STOP_TIMEOUT_S)
        reap_orphans()
