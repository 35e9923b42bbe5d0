"""The kit's container image (`make image`), run for real: its own entrypoint, user, auth proxy,
probes and SIGTERM drain, on a one-CPU set, in a network namespace of its own.

`podman run` cannot start containers in this sandbox (crun cannot set rlimits), so the image's
file system and entrypoint run under `buildah run --isolation=chroot`, which shares the
caller's network: the test gives it a namespace with a veth pair, so what the container
publishes is reached at its own address and what it keeps on loopback is not reachable.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import requests
import torch

from handlers.loaders import load_model
from handlers.settings import Architecture, TextSettings
from handlers.text import encode, load_tokenizer
from kit.pin_worker import is_worker
from kit.variant import Variant
from tests.e2e.conftest import one_cpu
from tests.e2e.test_placement import allowed_list
from tests.e2e.test_serving import EMBEDDING_ATOL

pytestmark = [pytest.mark.e2e, pytest.mark.container]

START_DEADLINE_S = 600
DRAIN_S = 3
STOP_DEADLINE_S = DRAIN_S + 30  # the drain, nginx's graceful stop and TorchServe's (kit/supervise.py)
KIT_UID = 10001  # the image's user (Containerfile)
TEXT = "A man is playing a guitar."
# Where the kit writes: the volumes of deploy/k8s/deployment.yaml, whose root file system is
# read-only. /run holds buildah's own mount points (the key's among them).
WRITABLE = ("/opt/kit/logs", "/opt/kit/.cache", "/tmp", "/run")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


class Pod:
    """One container of the image in its own network namespace (10.231.0.2 seen from here)."""

    def __init__(self, image: str, work: Path):
        self.image = image
        suffix = f"{os.getpid() % 100000}"
        self.netns, self.veth = f"kit-img-{suffix}", f"kvh{suffix}"
        self.address = "10.231.0.2"
        self.key = secrets.token_urlsafe(32)
        self.key_dir = work / "secret"
        self.key_dir.mkdir()
        (self.key_dir / "api-key").write_text(self.key + "\n")
        self.log = work / "container.log"
        self.containers: list[str] = []
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Pod:
        sh("ip", "netns", "add", self.netns)
        sh("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        sh("ip", "addr", "add", "10.231.0.1/30", "dev", self.veth)
        sh("ip", "link", "set", self.veth, "up")
        for command in (
            ("addr", "add", f"{self.address}/30", "dev", "eth0"),
            ("link", "set", "eth0", "up"),
            ("link", "set", "lo", "up"),
        ):
            sh("ip", "netns", "exec", self.netns, "ip", *command)
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
        for container in self.containers:
            sh("buildah", "rm", container, check=False)
        sh("ip", "netns", "delete", self.netns, check=False)
        sh("ip", "link", "delete", self.veth, check=False)

    def kill(self) -> None:
        """The container's whole process tree, if it still runs (a failed test's)."""
        if self.process is None or self.process.poll() is not None:
            return
        tree = [psutil.Process(self.process.pid), *self.processes()]
        for process in tree:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(tree, timeout=30)

    def container(self) -> str:
        name = sh("buildah", "from", self.image).stdout.strip()
        self.containers.append(name)
        return name

    def entrypoint(self) -> list[str]:
        config = json.loads(sh("podman", "image", "inspect", "--format", "{{json .Config}}", self.image).stdout)
        return config["Entrypoint"] + config["Cmd"]

    def run_argv(self, container: str, *args: str, cpus: str | None = None) -> list[str]:
        pin = ["taskset", "-c", cpus] if cpus else []
        # nsenter, not `ip netns exec`, which remounts /sys and so hides the cgroup file system;
        # that is bound in read-only, as container runtimes mount it: the kit reads its quota there.
        return [
            "nsenter",
            f"--net=/run/netns/{self.netns}",
            *pin,
            "buildah",
            "run",
            "--isolation=chroot",
            "-v",
            f"{self.key_dir}:/run/secrets/kit:ro",
            "-v",
            "/sys/fs/cgroup:/sys/fs/cgroup:ro",
            container,
            "--",
            *args,
        ]

    def start(self, cpus: str | None, *extra: str, cgroup: Path | None = None) -> None:
        self.serving = self.container()
        self.started = time.time()
        argv = self.run_argv(self.serving, *self.entrypoint(), *extra, cpus=cpus)
        if cgroup:  # join the cgroup first: everything the container starts inherits it
            argv = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *argv]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_DEADLINE_S
        while "[run] serving" not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the container did not become ready:\n{self.log.read_text()[-4000:]}")
            time.sleep(1)

    def probe(self, which: str) -> subprocess.CompletedProcess:
        return sh(*self.run_argv(self.serving, "python", "-m", "kit", "probe", which), check=False)

    def url(self, port: int, path: str) -> str:
        return f"http://{self.address}:{port}{path}"

    def processes(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)

    def workers(self) -> list[psutil.Process]:
        return [p for p in self.processes() if is_worker(p.cmdline())]

    def supervisor(self) -> psutil.Process:
        """The image's PID 1 as this host sees it: `python -m kit run`."""
        return next(p for p in self.processes() if p.cmdline()[1:4] == ["-m", "kit", "run"])


@pytest.fixture(scope="module")
def pod(tmp_path_factory):
    image = os.environ.get("IMAGE")
    if not image:
        pytest.fail("IMAGE is unset: run the tests through `make test`, which builds the image (make image)")
    if sh("podman", "image", "exists", image, check=False).returncode != 0:
        pytest.fail(f"image {image} is not built: run `make image`")
    with Pod(image, tmp_path_factory.mktemp("image")) as pod:
        pod.cpu = one_cpu()
        pod.start(pod.cpu, "--models", "minilm", "--drain", str(DRAIN_S))
        yield pod


def predict(pod: Pod, key: str | None) -> requests.Response:
    headers = {"Content-Type": "text/plain", **({"Authorization": f"Bearer {key}"} if key else {})}
    return requests.post(pod.url(8080, "/predictions/minilm"), data=TEXT, headers=headers, timeout=60)


def test_the_published_api_needs_the_secret_key(pod):
    assert requests.get(pod.url(8080, "/ping"), timeout=10).json() == {"status": "Healthy"}
    for key in (None, "not-the-key-but-long-enough"):
        refused = predict(pod, key)
        assert refused.status_code == 401, refused.text
        assert refused.headers["Content-Type"] == "application/json"
        assert refused.headers["WWW-Authenticate"] == "Bearer"
        assert "Authorization: Bearer" in refused.json()["message"]


def test_the_served_embedding_equals_the_eager_reference(pod):
    response = predict(pod, pod.key)
    assert response.status_code == 200, response.text
    served = torch.tensor(response.json())
    model_dir = Variant.load("eager").archive("minilm")
    model = load_model(TextSettings(architecture=Architecture.SENTENCE_EMBEDDER), model_dir)
    inputs = tuple(t[None] for t in encode(load_tokenizer(model_dir), TEXT, 128).inputs)
    with torch.inference_mode():
        reference = model(*inputs)[0]
    torch.testing.assert_close(served, reference, rtol=0, atol=EMBEDDING_ATOL)


def test_the_openai_base_url_is_on_the_published_port_behind_the_key(pod):
    """The one OpenAI base URL (kit/openai_router.py, inside the image) at /v1 on 8080: the official
    client with the key lists the model and gets the embedding the kit's own path gives; without
    it, a 401 in OpenAI's shape."""
    from openai import AuthenticationError, OpenAI

    client = OpenAI(base_url=pod.url(8080, "/v1"), api_key=pod.key)
    assert [m.id for m in client.models.list()] == ["minilm"]
    (vector,) = client.embeddings.create(model="minilm", input=TEXT, encoding_format="float").data
    direct = predict(pod, pod.key).json()
    torch.testing.assert_close(torch.tensor(vector.embedding), torch.tensor(direct), rtol=0, atol=EMBEDDING_ATOL)
    with pytest.raises(AuthenticationError, match="send the API key as api_key"):
        OpenAI(base_url=pod.url(8080, "/v1"), api_key="not-the-key-but-long-enough").models.list()


def test_a_form_encoded_body_reaches_the_model_as_bytes(pod):
    # curl --data's default Content-Type: TorchServe alone would try to decode a form (500).
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Authorization": f"Bearer {pod.key}"}
    response = requests.post(pod.url(8080, "/predictions/minilm"), data=TEXT, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    assert len(response.json()) == 384


def test_metrics_are_published_and_management_is_not(pod):
    predict(pod, pod.key)
    metrics = requests.get(pod.url(8082, "/metrics"), timeout=10)
    assert metrics.status_code == 200 and "ts_inference_requests_total" in metrics.text
    assert requests.get(pod.url(8082, "/models"), timeout=10).status_code == 404
    for port in (8181, 8180, 8081):  # TorchServe's own ports stay on the container's loopback
        with pytest.raises(requests.ConnectionError):
            requests.get(pod.url(port, "/models"), timeout=5)


def test_workers_run_as_the_image_user_on_the_containers_cpu_set(pod):
    workers = pod.workers()
    assert len(workers) == 1, "one CPU: the plan gives the model one worker"
    for worker in workers:
        assert worker.uids().real == KIT_UID
        assert allowed_list(worker.pid) == pod.cpu


def test_probes_pass_while_serving(pod):
    for which in ("ready", "live"):
        result = pod.probe(which)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"{which}: ok" in result.stdout


def test_a_missing_key_file_stops_the_start_with_its_path(pod):
    container = pod.container()
    argv = pod.run_argv(container, "python", "-m", "kit", "run", "--key-file", "/run/secrets/none/api-key")
    result = sh(*argv, check=False)
    assert result.returncode == 1
    assert "API key file /run/secrets/none/api-key does not exist" in result.stderr


def test_sigterm_drains_then_stops_everything(pod):
    # It ends the container: only the file system check and the quota's own container follow.
    supervisor = pod.supervisor()
    tree = [supervisor, *supervisor.children(recursive=True)]
    stopped_at = time.monotonic()
    supervisor.send_signal(signal.SIGTERM)
    time.sleep(1)
    assert pod.probe("ready").returncode == 1, "not ready as soon as the stop begins"
    assert predict(pod, pod.key).status_code == 200, "still serving during the drain"
    # buildah's own exit status is not the container's here: after other `buildah run`s on the
    # same container (the probes) it panics on the way out. The supervisor logs its own.
    pod.process.wait(STOP_DEADLINE_S)
    elapsed = time.monotonic() - stopped_at
    assert DRAIN_S <= elapsed < STOP_DEADLINE_S
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert "[run] stopped (exit status 0)" in pod.log.read_text()


def test_the_container_wrote_only_where_the_deployment_mounts_volumes(pod):
    # After the stop: mounting the file system of a running container here (buildah mount)
    # hides later changes from `buildah run`s on it.
    root = Path(sh("buildah", "mount", pod.serving).stdout.strip())
    try:
        written = [
            "/" + str(path.relative_to(root))
            for path in root.rglob("*")
            if not path.is_symlink() and path.lstat().st_mtime > pod.started
        ]
    finally:
        sh("buildah", "umount", pod.serving)
    assert written, "the kit wrote its run directory: the check sees writes"
    assert [path for path in written if not path.startswith(WRITABLE)] == []


def cpu_cgroup_with_quota(name: str, cpus: float) -> Path:
    """A new cgroup limited to `cpus` CPUs of CPU time (cgroup v2 cpu.max, or v1 CFS quota)."""
    root = Path("/sys/fs/cgroup")
    period = 100_000
    if (root / "cgroup.controllers").is_file():  # v2
        (root / "cgroup.subtree_control").write_text("+cpu")
        group = root / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{int(cpus * period)} {period}")
    else:
        group = root / "cpu" / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))
    return group


def test_a_cpu_limit_is_planned_from_not_the_hosts_cores(pod):
    # Every CPU in the affinity mask, but a CFS quota of one CPU (a pod's `limits.cpu: 1`): the
    # plan fits one core's worth of workers, however many CPUs the container may run on.
    group = cpu_cgroup_with_quota(f"kit-image-test-{os.getpid()}", 1.0)
    try:
        pod.start(None, "--models", "minilm", "--drain", "0", cgroup=group)
        workers = pod.workers()
        assert len(workers) == 1, f"a 1-CPU quota on {len(os.sched_getaffinity(0))} CPUs: one worker"
        assert len(allowed_list(workers[0].pid).split(",")) == 1 and "-" not in allowed_list(workers[0].pid)
        pod.supervisor().send_signal(signal.SIGTERM)
        pod.process.wait(STOP_DEADLINE_S)
    finally:
        pod.kill()
        group.rmdir()
