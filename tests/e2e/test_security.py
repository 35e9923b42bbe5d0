"""Security defaults on a real server: token auth on a non-loopback bind, management kept local.

Only loopback traffic is sent; where the API listens is read from the frontend's own sockets.
"""

from __future__ import annotations

import ipaddress

import psutil
import pytest
import requests

from kit.serve_config import ServeConfig
from tests.e2e.conftest import start_server

pytestmark = pytest.mark.e2e


def listening_addresses(server) -> dict[int, ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """port -> bound IP of every TCP socket the server's processes listen on (Java reports
    IPv4 binds in the mapped form ::ffff:a.b.c.d; they are unmapped here)."""
    listening = {}
    for process in server.process_tree():
        try:
            connections = process.net_connections(kind="tcp")
        except psutil.Error:
            continue
        for connection in connections:
            if connection.status == psutil.CONN_LISTEN:
                address = ipaddress.ip_address(connection.laddr.ip)
                listening[connection.laddr.port] = getattr(address, "ipv4_mapped", None) or address
    return listening


def test_public_bind_requires_a_token_and_keeps_management_on_loopback(tmp_path):
    # Eager: what is checked is the preset's binds and keys, not a compiler (it would add ~20 s).
    config = ServeConfig.from_preset("optimized", variant="eager", models=["minilm"], bind="0.0.0.0")
    server = start_server(tmp_path, config)
    try:
        url = server.api.url("inference", "/predictions/minilm")
        anonymous = requests.post(url, data=b"hello", headers={"Content-Type": "text/plain"}, timeout=60)
        assert anonymous.status_code in (400, 401), anonymous.text
        assert "Token Authorization failed" in anonymous.text
        assert "[" not in anonymous.text  # no embedding leaked
        with_key = requests.post(
            url, data=b"hello", headers={"Content-Type": "text/plain", **server.api.headers("inference")}, timeout=60
        )
        assert with_key.status_code == 200 and len(with_key.json()) == 384
        # The one OpenAI base URL checks the key an OpenAI client sends as its api_key.
        from openai import AuthenticationError, OpenAI

        base = server.api.openai_url("/v1")
        with pytest.raises(AuthenticationError, match="Token Authorization failed"):
            OpenAI(base_url=base, api_key="not-the-key").embeddings.create(model="minilm", input="hello")
        key = server.api.keys()["inference"]
        vectors = OpenAI(base_url=base, api_key=key).embeddings.create(model="minilm", input=["hello", "you"]).data
        assert [len(v.embedding) for v in vectors] == [384, 384]

        listening = listening_addresses(server)
        assert listening[server.config.inference_port].is_unspecified  # all interfaces, as asked
        assert listening[server.config.management_port].is_loopback  # not exposed with it
        assert listening[server.config.metrics_port].is_unspecified
        # gRPC (always on in TorchServe 0.12, unused by the kit) never leaves loopback.
        assert listening[server.config.grpc_inference_port].is_loopback
        assert listening[server.config.grpc_management_port].is_loopback
    finally:
        server.stop()
