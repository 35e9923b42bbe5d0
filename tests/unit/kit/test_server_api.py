"""kit/server_api.py: URLs, ports and token-auth headers of a server, without a server."""

from __future__ import annotations

import json

from kit.serve_config import ServeConfig
from kit.server_api import KEY_FILE, ServerApi


def test_urls_reach_a_server_bound_to_every_interface_through_loopback(tmp_path):
    config = ServeConfig.from_preset("optimized", bind="0.0.0.0", inference_port=18080, management_port=18081)
    api = ServerApi(config, tmp_path)
    assert api.url("inference", "/ping") == "http://127.0.0.1:18080/ping"
    assert api.url("management", "/models") == "http://127.0.0.1:18081/models"  # management stays on loopback
    assert set(api.ports) == {"inference", "management", "metrics", "grpc_inference", "grpc_management"}


def test_headers_carry_the_key_torchserve_wrote_only_when_token_auth_is_on(tmp_path):
    keys = {"management": {"key": "m-key"}, "inference": {"key": "i-key"}, "API": {"key": "x"}}
    (tmp_path / KEY_FILE).write_text(json.dumps(keys))
    exposed = ServerApi(ServeConfig.from_preset("optimized", bind="0.0.0.0"), tmp_path)
    assert exposed.headers("inference") == {"Authorization": "Bearer i-key"}
    assert exposed.keys() == {"management": "m-key", "inference": "i-key"}
    local = ServerApi(ServeConfig.from_preset("optimized"), tmp_path)  # loopback only: no auth
    assert local.headers("inference") == {}


def test_a_key_file_torchserve_has_not_finished_writing_gives_no_keys_yet(tmp_path):
    """Polled during a start, the file can exist before its contents: no keys yet, asked again."""
    api = ServerApi(ServeConfig.from_preset("optimized", bind="0.0.0.0"), tmp_path)
    for partial in ("", '{"management": {"ke'):
        (tmp_path / KEY_FILE).write_text(partial)
        assert api.keys() == {} and api.headers("management") == {}
