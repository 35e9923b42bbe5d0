"""A real Prometheus (Debian's, installed by scripts/test_tools.sh) scraping running servers, and
what deploy/ ships for it: the rules of deploy/k8s/prometheusrule.yaml as a rules file, and the
Grafana dashboard's queries as Prometheus runs them.

    with Prometheus.scraping(tmp_path, ["127.0.0.1:8000"], rules_file(tmp_path)) as prometheus:
        prometheus.query('sum(kit_requests_total)')      # the HTTP API's result list
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import requests
import yaml

from kit.paths import ROOT
from kit.ports import PORTS

RULES = ROOT / "deploy" / "k8s" / "prometheusrule.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "kit-serve.json"
SCRAPE_INTERVAL_S = 1
# Grafana's variables, as a query over the last minute of every model would have them.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$model": ".+"}


def rules_file(directory: Path) -> Path:
    """The PrometheusRule's spec, which is a Prometheus rules file."""
    path = directory / "kit-rules.yml"
    path.write_text(yaml.safe_dump(yaml.safe_load(RULES.read_text())["spec"]))
    return path


def recorded_series() -> list[str]:
    return [
        rule["record"]
        for group in yaml.safe_load(RULES.read_text())["spec"]["groups"]
        for rule in group["rules"]
        if "record" in rule
    ]


def dashboard_queries() -> dict[str, str]:
    """Each panel target's query, with Grafana's variables put in, by "panel title / refId"."""
    queries = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            queries[f"{panel['title']} / {target['refId']}"] = expr
    return queries


def finite(result: list[dict]) -> bool:
    """Whether an instant query's result holds a number (histogram_quantile of no rate is NaN)."""
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


class Prometheus:
    def __init__(self, url: str, process: subprocess.Popen):
        self.url, self.process = url, process

    @classmethod
    @contextlib.contextmanager
    def scraping(cls, directory: Path, targets: list[str], rules: Path | None = None) -> Iterator[Prometheus]:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is not installed: make test-tools installs it"
        config = {
            "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
            "scrape_configs": [{"job_name": "kit-serve", "static_configs": [{"targets": targets}]}],
        }
        if rules is not None:
            config["rule_files"] = [str(rules)]
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        (port,) = PORTS.take(1)
        command = [
            binary,
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        with open(directory / "prometheus.log", "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        prometheus = cls(f"http://127.0.0.1:{port}", process)
        try:
            prometheus.wait_ready(directory / "prometheus.log", len(targets))
            yield prometheus
        finally:
            process.terminate()
            process.wait(timeout=30)

    def wait_ready(self, log: Path, targets: int, timeout_s: float = 60) -> None:
        """Until every target was scraped once. Prometheus hands its scrapers new targets at most
        every 5 s: a query before that finds nothing, and a counter's increase() needs a sample
        from before the requests it counts."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"prometheus exited:\n{log.read_text()[-3000:]}"
            with contextlib.suppress(requests.ConnectionError):
                # It listens a moment before it is ready, and answers 503 (not JSON) until then.
                ready = requests.get(f"{self.url}/-/ready", timeout=10).status_code == 200
                health = self.targets_up() if ready else {}
                if len(health) == targets and set(health.values()) == {"up"}:
                    return
            time.sleep(0.2)
        raise AssertionError(
            f"prometheus did not scrape {targets} targets in {timeout_s} s:\n{log.read_text()[-3000:]}"
        )

    def query(self, expr: str) -> list[dict]:
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    def targets_up(self) -> dict[str, str]:
        """Each scraped target's health, by its address."""
        answer = requests.get(f"{self.url}/api/v1/targets", timeout=10).json()
        return {t["labels"]["instance"]: t["health"] for t in answer["data"]["activeTargets"]}

    def wait_for(self, expr: str, timeout_s: float = 30) -> list[dict]:
        """The query's result once it holds a number."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if finite(result) or time.monotonic() > deadline:
                return result
            time.sleep(SCRAPE_INTERVAL_S / 2)
