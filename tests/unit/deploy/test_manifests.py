"""deploy/k8s, validated offline: every built-in resource against Kubernetes' own schemas
(kubernetes-validate, strict: unknown fields are errors), the ServiceMonitor against a schema of
the fields it uses, and the manifests against the kit
(probe commands, ports, preset, drain time, metric names) so neither drifts from the other."""

from __future__ import annotations

import json
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kit import probe, supervise
from kit.paths import ROOT
from kit.proxy import AuthProxy
from kit.serve_config import ServeConfig
from kit.server import START_DEADLINE_S

K8S = ROOT / "deploy" / "k8s"
# The oldest Kubernetes release still in wide use and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# No schema of these is bundled: each is checked against one of the fields deploy/k8s uses.
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", kind): ROOT / "tests" / "fixtures" / "k8s" / f"{kind.lower()}-v1.schema.json"
    for kind in ("ServiceMonitor", "PrometheusRule")
}
KUSTOMIZATION = yaml.safe_load((K8S / "kustomization.yaml").read_text())


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def resource(kind: str) -> dict:
    (found,) = [d for n in KUSTOMIZATION["resources"] for d in documents(n) if d["kind"] == kind]
    return found


RESOURCES = [d for n in [*KUSTOMIZATION["resources"], "prometheus-adapter-rules.yaml"] for d in documents(n)]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "document", [d for d in RESOURCES if (d["apiVersion"], d["kind"]) not in CRD_SCHEMAS], ids=lambda d: d["kind"]
)
def test_resource_is_valid_for_kubernetes(document, version):
    kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize(
    "document", [d for d in RESOURCES if (d["apiVersion"], d["kind"]) in CRD_SCHEMAS], ids=lambda d: d["kind"]
)
def test_custom_resource_matches_its_schema(document):
    schema = json.loads(CRD_SCHEMAS[document["apiVersion"], document["kind"]].read_text())
    jsonschema.validate(document, schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema refuses what it does not know
        jsonschema.validate({**document, "spec": {**document["spec"], "endpoint": []}}, schema)


def test_every_file_is_applied_or_generated():
    generated = {f for g in KUSTOMIZATION["configMapGenerator"] + KUSTOMIZATION["secretGenerator"] for f in g["files"]}
    listed = set(KUSTOMIZATION["resources"]) | generated | {"kustomization.yaml", "prometheus-adapter-rules.yaml"}
    assert {p.name for p in K8S.glob("*.yaml")} <= listed
    assert set(KUSTOMIZATION["resources"]) <= {p.name for p in K8S.glob("*.yaml")}


@pytest.fixture(scope="module")
def pod() -> dict:
    return resource("Deployment")["spec"]["template"]


@pytest.fixture(scope="module")
def container(pod) -> dict:
    (only,) = pod["spec"]["containers"]
    return only


def test_guaranteed_qos_with_whole_cpus(container):
    resources = container["resources"]
    assert resources["requests"] == resources["limits"], "Guaranteed QoS: requests equal limits"
    assert str(resources["limits"]["cpu"]).isdigit(), "whole CPUs: the static CPU manager gives exclusive cores"


def test_probes_run_the_kits_probes_with_the_start_up_budget_of_the_kit(container):
    assert container["startupProbe"]["exec"]["command"][-2:] == ["probe", "ready"]
    assert container["readinessProbe"]["exec"]["command"][-2:] == ["probe", "ready"]
    assert container["livenessProbe"]["exec"]["command"][-2:] == ["probe", "live"]
    assert {"ready", "live"} <= set(probe.PROBES)
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= START_DEADLINE_S


def test_the_grace_period_covers_the_drain_and_the_stop(pod):
    needed = supervise.DRAIN_S + supervise.PROXY_STOP_TIMEOUT_S + supervise.STOP_TIMEOUT_S
    assert pod["spec"]["terminationGracePeriodSeconds"] >= needed


def test_the_preset_fits_the_auth_proxy_and_its_ports_are_the_containers(container, tmp_path):
    config = ServeConfig.from_preset(str(K8S / "preset.yaml"))
    proxy = AuthProxy(tmp_path / "key")
    proxy.check(config)  # TorchServe on loopback, on ports the proxy does not publish
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": proxy.inference_port, "metrics": proxy.metrics_port}
    args = container["args"]
    assert args[args.index("--config") + 1] == "/etc/kit/preset.yaml"
    assert args[args.index("--key-file") + 1] == "/run/secrets/kit/api-key"


def test_mounts_give_the_preset_the_key_and_every_directory_the_kit_writes(pod, container):
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert mounts["/etc/kit"]["configMap"]["name"] == KUSTOMIZATION["configMapGenerator"][0]["name"]
    assert mounts["/run/secrets/kit"]["secret"]["secretName"] == KUSTOMIZATION["secretGenerator"][0]["name"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    for writable in ("/opt/kit/logs", "/opt/kit/.cache", "/tmp"):  # run dir, Inductor cache, TMPDIR
        assert "emptyDir" in mounts[writable]
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001  # the image's user (Containerfile)


def test_the_service_and_service_monitor_reach_the_named_ports(pod, container):
    labels = pod["metadata"]["labels"]
    service = resource("Service")["spec"]
    assert service["selector"].items() <= labels.items()
    names = {p["name"] for p in container["ports"]}
    assert {p["targetPort"] for p in service["ports"]} <= names
    monitor = resource("ServiceMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()
    assert {e["port"] for e in monitor["endpoints"]} <= {p["name"] for p in service["ports"]}


def test_the_network_policy_opens_the_published_ports_only(container):
    policy = resource("NetworkPolicy")["spec"]
    opened = {p["port"] for rule in policy["ingress"] for p in rule["ports"]}
    assert opened == {p["containerPort"] for p in container["ports"]}
    (metrics_rule,) = [r for r in policy["ingress"] if {p["port"] for p in r["ports"]} == {8082}]
    assert metrics_rule["from"], "metrics only from the monitoring namespace"
    assert policy["egress"] == []


def test_the_autoscaler_and_budget_target_the_deployment(pod):
    hpa = resource("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == resource("Deployment")["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    (rules,) = documents("prometheus-adapter-rules.yaml")
    rule, waiting = yaml.safe_load(rules["data"]["config.yaml"])["rules"]
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
    assert waiting["seriesQuery"].startswith("kit_lm_num_requests_waiting{")  # the router's gauge
    # The language-model overlay's autoscaler: the base's, scaling on that rule's metric.
    overlay = yaml.safe_load((K8S.parent / "k8s-language-model" / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["../k8s"]
    ((patch,),) = [yaml.safe_load(p["patch"]) for p in overlay["patches"] if p["target"]["kind"] == hpa["kind"]]
    assert (patch["op"], patch["path"]) == ("replace", "/spec/metrics")
    patched = {**hpa, "spec": {**hpa["spec"], "metrics": patch["value"]}}
    kubernetes_validate.validate(patched, KUBERNETES_VERSIONS[-1], strict=True)
    (lm_metric,) = patched["spec"]["metrics"]
    assert lm_metric["pods"]["metric"]["name"] == waiting["name"]["as"]
    # TorchServe's queue latency is a counter: the rule divides its rate by the request rate.
    assert "rate(ts_queue_latency_microseconds" in rule["metricsQuery"]
    assert "rate(ts_inference_requests_total" in rule["metricsQuery"]
    budget = resource("PodDisruptionBudget")["spec"]
    assert budget["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_the_rules_and_dashboard_read_only_series_the_kit_exports(tmp_path):
    """Every kit_ series a rule or a dashboard query names is one the router renders (a recorded
    series, `a:kit_...:b`, is the rule's own)."""
    from kit import metrics_text
    from tests.prometheus import dashboard_queries

    (rule,) = documents("prometheusrule.yaml")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]] + list(dashboard_queries().values())
    named = {n for expr in exprs for n in re.findall(r"(?<![:\w])(kit_\w+)(?![:\w])", expr)}
    exported = re.findall(r"^# TYPE (kit_\w+) (\w+)$", metrics_text.render(tmp_path), re.MULTILINE)
    known = {name if kind != "histogram" else f"{name}_bucket" for name, kind in exported}
    assert named and named <= known, named - known


def test_the_image_name_is_the_one_kustomize_rewrites(container):
    assert container["image"] == KUSTOMIZATION["images"][0]["name"]


def test_the_api_key_file_is_never_committed():
    assert "deploy/k8s/api-key" in (ROOT / ".gitignore").read_text().splitlines()
