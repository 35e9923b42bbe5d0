"""Real TorchServe starts on the kit's ports: never a bind failure from the kit's own picks, and a
port another process takes before the JVM binds it costs one retry, not the start."""

from __future__ import annotations

import socket

import pytest
import requests

import kit.server
from kit.ports import read_ephemeral_range
from kit.serve_config import Allocator, Placement, ServeConfig, free_ports_config
from kit.server import START_DEADLINE_S, Server, start_ready
from tests.e2e.conftest import one_cpu

pytestmark = pytest.mark.e2e

STARTS = 12
# A frontend without models: the JVM binds all five ports in about a second.
FRONTEND_ONLY = ServeConfig(models=(), placement=Placement.NONE, allocator=Allocator.DEFAULT)


def attempts_kept(run_dir) -> list[str]:
    return sorted(p.name for p in run_dir.parent.glob(f"{run_dir.name}.attempt-*"))


def test_a_dozen_starts_in_a_row_never_fail_on_a_bind(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    servers: list[Server] = []
    try:
        for number in range(STARTS):  # each stays up: later picks must avoid the ports already bound
            run_dir = tmp_path / f"server-{number}"
            servers.append(start_ready(FRONTEND_ONLY, run_dir, 120, progress=lambda m: None, model_store=store))
            assert attempts_kept(run_dir) == [], f"start {number} lost a port: {attempts_kept(run_dir)}"
        ports = [port for server in servers for port in server.api.ports.values()]
        assert len(set(ports)) == len(ports) == 5 * STARTS
        ephemeral = read_ephemeral_range()
        assert not [port for port in ports if port in ephemeral], "a kit port inside the ephemeral range"
        for server in servers:  # bound by the server's own JVM, read from /proc
            assert set(server.api.ports.values()) <= server.listening_ports()
            assert requests.get(server.api.url("inference", "/ping"), timeout=5).json()["status"] == "Healthy"
    finally:
        for server in servers:
            server.stop()


def test_a_port_taken_before_the_jvm_binds_it_is_retried_on_fresh_ports(tmp_path, monkeypatch):
    """What killed `make tune` at row 8: the gRPC port was taken in the seconds between the pick and
    the JVM's bind. Here a listening socket takes it at exactly that moment, on the first start."""
    holders: list[socket.socket] = []

    def take_the_grpc_port_once(config: ServeConfig) -> ServeConfig:
        picked = free_ports_config(config)
        if not holders:
            holder = socket.socket()
            holder.bind(("127.0.0.1", picked.grpc_inference_port))
            holder.listen()
            holders.append(holder)
        return picked

    monkeypatch.setattr(kit.server, "free_ports_config", take_the_grpc_port_once)
    config = ServeConfig.from_preset("optimized", models=["minilm"], variant="eager", cpus=one_cpu())
    run_dir = tmp_path / "run"
    messages: list[str] = []
    try:
        server = start_ready(config, run_dir, START_DEADLINE_S, progress=messages.append)
        try:
            taken = holders[0].getsockname()[1]
            assert server.config.grpc_inference_port != taken
            assert server.ready_models() == {"minilm"}
            answer = requests.post(server.api.url("inference", "/predictions/minilm"), data="a sentence", timeout=60)
            assert answer.status_code == 200, answer.text
        finally:
            server.stop()
    finally:
        for holder in holders:
            holder.close()
    assert attempts_kept(run_dir) == ["run.attempt-1"]
    failed_log = (tmp_path / "run.attempt-1" / "torchserve.out").read_text()
    assert f"Failed to bind to address /127.0.0.1:{taken}" in failed_log
    assert any(f"127.0.0.1:{taken}" in m and "starting again on fresh ports (attempt 2 of 3" in m for m in messages)
