"""The container's pieces without a container: the auth proxy's key and config, the probes."""

from __future__ import annotations

import dataclasses

import pytest

from kit import probe
from kit.proxy import AuthProxy, read_key
from kit.serve_config import ConfigError, ServeConfig
from kit.supervise import ready_file

KEY = "k" * 20 + "+/=-._~9"


@pytest.fixture
def container_config() -> ServeConfig:
    return ServeConfig.from_preset("container")


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "api-key"
    path.write_text(KEY + "\n")  # `kubectl create secret --from-file` keeps a trailing newline
    return path


def test_the_key_is_read_without_its_newline(key_file):
    assert read_key(key_file) == KEY


def test_a_missing_key_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=f"API key file {tmp_path / 'none'} does not exist"):
        read_key(tmp_path / "none")


@pytest.mark.parametrize("key", ["short", "x" * 20 + '"; return 200; "', "x" * 20 + " y", "x" * 600])
def test_a_key_nginx_could_misread_is_refused_without_echoing_it(tmp_path, key):
    path = tmp_path / "api-key"
    path.write_text(key)
    with pytest.raises(ConfigError, match="16-512 characters") as error:
        read_key(path)
    assert key not in str(error.value)


def test_the_proxy_config_requires_the_key_and_forwards_to_torchserve(container_config, key_file, tmp_path):
    text = AuthProxy(key_file).render(container_config, tmp_path)
    assert f'if ($http_authorization != "Bearer {KEY}")' in text
    assert f"server 127.0.0.1:{container_config.inference_port};" in text
    assert f"server 127.0.0.1:{container_config.metrics_port};" in text
    assert "listen 8080;" in text and "listen 8082;" in text
    # The metrics port's /metrics is the router's: the kit's series, then TorchServe's.
    assert "location = /metrics { proxy_pass http://openai_router; }" in text
    alone = AuthProxy(key_file).render(dataclasses.replace(container_config, openai_port=0), tmp_path)
    assert "location = /metrics { proxy_pass http://torchserve_metrics; }" in alone
    assert f"client_max_body_size {container_config.max_request_mb}m;" in text
    assert str(container_config.management_port) not in text, "the management API is never published"
    # Form bodies go on as bytes: TorchServe would decode them itself and answer 500.
    assert "~*^application/x-www-form-urlencoded application/octet-stream;" in text
    assert "proxy_set_header Content-Type $kit_content_type;" in text


def test_the_proxy_refuses_a_torchserve_it_would_not_hide(container_config, key_file, tmp_path):
    exposed = dataclasses.replace(container_config, bind="0.0.0.0", token_auth=True)
    with pytest.raises(ConfigError, match="binds 127.0.0.1 only"):
        AuthProxy(key_file).render(exposed, tmp_path)
    clash = dataclasses.replace(container_config, inference_port=8080)
    with pytest.raises(ConfigError, match="give TorchServe other ports"):
        AuthProxy(key_file).render(clash, tmp_path)


def test_not_ready_without_the_ready_file_nor_a_running_server(tmp_path):
    assert "no ready file" in probe.not_ready(tmp_path)
    ready_file(tmp_path).write_text("0\n")
    assert probe.not_ready(tmp_path) == "not ready: TorchServe is not running"


def test_live_while_starting_but_not_after_torchserve_exited(tmp_path, container_config):
    assert probe.not_live(tmp_path) is None, "start-up is the startup probe's to judge"
    (tmp_path / "server.json").write_text(
        '{"pid": 999999999, "config": {}, "model_store": "' + str(tmp_path) + '", "layout": null}'
    )
    assert probe.not_live(tmp_path) == "not live: TorchServe has exited"
