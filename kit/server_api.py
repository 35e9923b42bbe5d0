"""A client of one running TorchServe's APIs: its ports and URLs, token-auth headers, and the
management API's view of the models and their workers.

    api = server.api
    requests.post(api.url("inference", f"/predictions/{model}"), data=body, headers=api.headers("inference"))
    [w.process.pid for w in api.workers() if w.model == model]
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import requests

from kit.procinfo import ProcessInfo, live_process
from kit.serve_config import ServeConfig

KEY_FILE = "key_file.json"  # written by TorchServe into its working directory when token auth is on


@dataclasses.dataclass(frozen=True)
class WorkerStatus:
    model: str
    worker_id: str
    status: str  # READY, UNLOADING, ...
    process: ProcessInfo | None  # None while the worker has no live process


@dataclasses.dataclass(frozen=True)
class ServerApi:
    config: ServeConfig
    run_dir: Path  # TorchServe's working directory: where it writes the key file

    def keys(self) -> dict[str, str]:
        """Token-auth keys {"management": ..., "inference": ...}; empty when auth is off."""
        key_file = self.run_dir / KEY_FILE
        if not self.config.token_auth_enabled or not key_file.is_file():
            return {}
        try:
            raw = json.loads(key_file.read_text())
        except json.JSONDecodeError:  # TorchServe is still writing it (read empty during a start: CI at f74d1c7)
            return {}
        return {api: raw[api]["key"] for api in ("management", "inference") if api in raw}

    def headers(self, api: str) -> dict[str, str]:
        key = self.keys().get(api)
        return {"Authorization": f"Bearer {key}"} if key else {}

    @property
    def ports(self) -> dict[str, int]:
        """Every TCP port the frontend listens on, by API."""
        c = self.config
        return {
            "inference": c.inference_port,
            "management": c.management_port,
            "metrics": c.metrics_port,
            "grpc_inference": c.grpc_inference_port,
            "grpc_management": c.grpc_management_port,
        }

    def url(self, api: str, path: str) -> str:
        port = self.ports[api]
        bind = self.config.management_bind if api == "management" else self.config.bind
        host = "127.0.0.1" if bind in ("0.0.0.0", "::") else bind
        return f"http://{host}:{port}{path}"

    def openai_url(self, path: str) -> str:
        """The OpenAI router's (kit/openai_router.py): `path` after its host, e.g. /v1."""
        host = "127.0.0.1" if self.config.bind in ("0.0.0.0", "::") else self.config.bind
        return f"http://{host}:{self.config.openai_port}{path}"

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

    def worker_statuses(self, model: str) -> list[str] | None:
        """The statuses of a model's workers (a loading worker shows UNLOADING); None while the
        management API does not answer."""
        try:
            versions = self.describe(model)
        except requests.RequestException:
            return None
        return [w.get("status") for v in versions for w in v.get("workers", [])]
