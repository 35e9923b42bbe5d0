"""kit/hints.py: the call `make serve` prints to try each model, by its task."""

from __future__ import annotations

import json
import shlex

from kit.hints import HINTS
from kit.models import Task

URL = "http://127.0.0.1:8080/predictions/mine"
BASE = "http://127.0.0.1:8000/v1"  # the OpenAI router's


def test_every_task_has_a_call_to_try():
    assert set(HINTS) == set(Task)


def test_a_language_model_is_tried_with_openai_calls_and_the_key_when_auth_is_on():
    curl, python = HINTS[Task.TEXT_GENERATION]("mine", BASE, ' -H "Authorization: Bearer $KEY"')
    argv = shlex.split(curl)
    assert argv[-1] == f"{BASE}/chat/completions" and "Authorization: Bearer $KEY" in argv
    body = json.loads(argv[argv.index("--data") + 1])
    assert body["model"] == "mine" and body["messages"][0]["role"] == "user" and body["stream"] is True
    code = shlex.split(python)[2]
    compile(code, "hint", "exec")  # the Python line is Python
    assert f'base_url="{BASE}"' in code and 'os.environ.get("KEY"' in code


def test_a_classifier_is_tried_with_a_content_type():
    (line,) = HINTS[Task.TEXT_CLASSIFICATION]("mine", URL, "")
    assert "Content-Type: text/plain" in line and line.endswith(URL)


def test_the_metrics_url_printed_is_the_routers_when_there_is_one(capsys, tmp_path):
    from types import SimpleNamespace

    from kit.hints import print_endpoints
    from kit.serve_config import ServeConfig
    from kit.server_api import ServerApi

    config = ServeConfig(models=[])
    for router_pid, url in ((123, "http://127.0.0.1:8000/metrics"), (None, "http://127.0.0.1:8082/metrics")):
        print_endpoints(SimpleNamespace(config=config, api=ServerApi(config, tmp_path), router_pid=router_pid))
        (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[serve] metrics")]
        assert line.split()[2] == url
