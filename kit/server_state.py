"""What a started server leaves in its run directory for a later `stop` or `status` (server.json),
and the one model store it serves from.

    ServerState(pid, config, store, layout, oom).save(run_dir); ServerState.load(run_dir)
    link_store({name: Variant.load("inductor").archive(name)}, run_dir / "model_store")
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from handlers.typed_config import parse_settings
from kit.layout import Layout
from kit.serve_config import ServeConfig
from kit.server_logs import OomWatch

STATE_FILE = "server.json"


@dataclasses.dataclass(frozen=True)
class ServerState:
    """What `start` leaves in the run directory for a later `stop` or `status` (server.json)."""

    pid: int
    config: ServeConfig
    model_store: Path
    layout: Layout | None
    oom: OomWatch
    router_pid: int | None = None  # the OpenAI router's (kit/openai_router.py), if one runs

    def save(self, run_dir: Path) -> None:
        state = {
            "pid": self.pid,
            "config": self.config.to_dict(),
            "model_store": str(self.model_store),
            "layout": self.layout.to_dict() if self.layout else None,
            "cgroup": self.oom.cgroup,
            "oom_kills_at_start": self.oom.kills_at_start,
            "router_pid": self.router_pid,
        }
        (run_dir / STATE_FILE).write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> ServerState | None:
        state_file = run_dir / STATE_FILE
        if not state_file.is_file():
            return None
        state = json.loads(state_file.read_text())
        layout = Layout.from_dict(state["layout"]) if state.get("layout") else None
        oom = OomWatch(state.get("cgroup"), state.get("oom_kills_at_start"))
        config = parse_settings(ServeConfig, state["config"])
        return cls(state["pid"], config, Path(state["model_store"]), layout, oom, state.get("router_pid"))


def link_store(archives: dict[str, Path], store: Path) -> None:
    """One directory holding each model's archive (TorchServe loads from one store): a symbolic
    link to each, which TorchServe follows and serves in place."""
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    for model, archive in archives.items():
        (store / model).symlink_to(archive.resolve(), target_is_directory=True)
