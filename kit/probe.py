"""Kubernetes probes of the kit's container (exec probes: exit 0 = pass, the line printed = why).

    python -m kit probe ready    # startupProbe and readinessProbe
    python -m kit probe live     # livenessProbe

Neither of TorchServe 0.12's health endpoints is enough alone: `/ping` answers "Healthy" before
any model is registered, and the OIP `/v2/health/ready` is always ready. `ready` passes only
while kit/supervise.py's ready file exists (every model had all its planned workers READY, and
no stop has begun) and the management API shows every worker READY now. `live` asks only
whether the frontend answers `/ping` at all: a model reloading a crashed worker is not ready,
but restarting the container would not help it.
"""

from __future__ import annotations

from pathlib import Path

import requests

from kit.server import Server
from kit.supervise import ready_file

PING_TIMEOUT_S = 5


def not_ready(run_dir: Path) -> str | None:
    """None when the server is ready to take traffic, else the reason."""
    if not ready_file(run_dir).exists():
        return "not ready: starting up or stopping (no ready file)"
    server = Server.from_state(run_dir)
    if server is None or not server.is_running():
        return "not ready: TorchServe is not running"
    waiting = sorted(set(server.config.models) - server.ready_models())
    return f"not ready: workers of {', '.join(waiting)} are not all READY" if waiting else None


def not_live(run_dir: Path) -> str | None:
    server = Server.from_state(run_dir)
    if server is None:
        return None  # still starting: the startup probe, not this one, judges start-up
    if not server.is_running():
        return "not live: TorchServe has exited"
    try:
        requests.get(server.api.url("inference", "/ping"), timeout=PING_TIMEOUT_S)
    except requests.RequestException as error:
        return f"not live: the frontend does not answer /ping ({type(error).__name__})"
    return None  # any answer, 500 included: the frontend's event loop runs


PROBES = {"ready": not_ready, "live": not_live}
