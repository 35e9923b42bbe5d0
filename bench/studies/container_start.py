"""Container start to ready, for each way the image handles Inductor's compile (what
`make image-start` runs; the image from `make image IMAGE_VARIANTS=inductor,aoti-int8`, or
`IMAGE_VARIANTS=inductor` for a language model).

    .venv/bin/python -m bench.studies.container_start [--models resnet50,bert,minilm] [--rounds 1]

- `inductor, empty cache`: an empty Inductor cache, as a new pod with an emptyDir has: a
  classifier compiles at start; a language model loads the graphs its archive ships (whole
  graphs for the image's Python, added by `make image`) on a CPU like the build machine's.
- `inductor, warm cache volume`: the cache the first start filled, mounted again, as a pod
  with a persistent volume at /opt/kit/.cache has after the first start on that CPU type.
- `aoti-int8, precompiled`: AOTInductor packages built with the image (`make archive`) for the
  build machine's CPU: nothing is compiled at start.

Each start runs the image's entrypoint (buildah run, the host's network) and counts from the
launch to the supervisor's "serving" line (every worker READY, the auth proxy up); then SIGTERM.
Results: bench/results/container-start-<time>/results.json and report.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.results import RESULTS, RunEnvironment
from kit.models import model_names

READY_LINE = "[run] serving"
DEADLINE_S = 1800


# In this order, every start with the same cache volume: the first fills the Inductor cache the
# second finds warm; the precompiled packages do not use it.
OPTIONS = {
    "inductor, empty cache": "inductor",
    "inductor, warm cache volume": "inductor",
    "aoti-int8, precompiled": "aoti-int8",
}


def image_variants(image: str) -> set[str]:
    container = subprocess.run(["buildah", "from", image], capture_output=True, text=True, check=True).stdout.strip()
    try:
        root = Path(
            subprocess.run(["buildah", "mount", container], capture_output=True, text=True, check=True).stdout.strip()
        )
        return {p.name for p in (root / "opt/kit/model_store").iterdir() if p.is_dir()}
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)


def start_to_ready(image: str, variant: str, models: str, cache: Path, key_dir: Path, log: Path) -> float:
    container = subprocess.run(["buildah", "from", image], capture_output=True, text=True, check=True).stdout.strip()
    argv = [
        "buildah",
        "run",
        "--isolation=chroot",
        "-v",
        f"{key_dir}:/run/secrets/kit:ro",
        "-v",
        f"{cache}:/opt/kit/.cache",
        container,
        "--",
        "python",
        "-m",
        "kit",
        "run",
        "--key-file",
        "/run/secrets/kit/api-key",
        "--variant",
        variant,
        "--models",
        models,
        "--drain",
        "0",
    ]
    try:
        with open(log, "w") as out:
            launched = time.monotonic()
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
            while READY_LINE not in log.read_text():
                if process.poll() is not None or time.monotonic() - launched > DEADLINE_S:
                    raise RuntimeError(f"{variant}: not ready; see {log}\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
            seconds = time.monotonic() - launched
            supervisor = next(
                p
                for p in psutil.Process(process.pid).children(recursive=True)
                if p.cmdline()[1:4] == ["-m", "kit", "run"]
            )
            supervisor.send_signal(signal.SIGTERM)
            process.wait(120)
        return seconds
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)


def markdown(env: RunEnvironment, image: str, models: str, rows: list[dict]) -> str:
    lines = [
        f"# Container start to ready: {image}",
        "",
        f"CPU: {env.cpu_model} ({env.cores} CPUs usable); commit {env.git_commit}; {env.date}",
        f"Models: {models}. Command: `make image-start` (python -m bench.studies.container_start).",
        "",
        "| option | start to ready, s (median) | each round, s |",
        "|---|---|---|",
    ]
    for row in rows:
        rounds = ", ".join(f"{s:.1f}" for s in row["seconds"])
        lines.append(f"| {row['option']} | {statistics.median(row['seconds']):.1f} | {rounds} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default=os.environ.get("IMAGE", ""), help="image tag (make passes IMAGE)")
    parser.add_argument("--models", default=",".join(model_names()))
    parser.add_argument("--rounds", type=int, default=1, help="starts per option (each cold one with a new cache)")
    args = parser.parse_args(argv)
    if not args.image:
        parser.error("--image (or IMAGE) is required: run `make image-start`")
    present = image_variants(args.image)
    options = {name: variant for name, variant in OPTIONS.items() if variant in present}
    skipped = sorted(set(OPTIONS) - set(options))
    if skipped:
        print(
            f"[start] skipped {skipped}: {args.image} has no such archives (a language model has no"
            " aoti-int8; for a classifier: make image IMAGE_VARIANTS=inductor,aoti-int8)"
        )
    env = RunEnvironment.capture()
    out = RESULTS / f"container-start-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    key_dir = out / "secret"
    key_dir.mkdir()
    (key_dir / "api-key").write_text(secrets.token_urlsafe(32))
    rows = {name: [] for name in options}
    for round_index in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="kit-cache-", dir=out) as cache:
            os.chmod(cache, 0o777)  # the image's user writes it
            for index, (name, variant) in enumerate(options.items()):
                log = out / f"start-{index}-{variant}-{round_index}.log"
                print(f"[start] round {round_index + 1}/{args.rounds}: {name} ...", flush=True)
                seconds = start_to_ready(args.image, variant, args.models, Path(cache), key_dir, log)
                rows[name].append(seconds)
                print(f"[start] {name}: ready after {seconds:.1f} s", flush=True)
    table = [{"option": name, "seconds": seconds} for name, seconds in rows.items()]
    record = {"image": args.image, "models": args.models, "environment": dataclasses.asdict(env), "rows": table}
    (out / "results.json").write_text(json.dumps(record, indent=2))
    report = markdown(env, args.image, args.models, table)
    (out / "report.md").write_text(report)
    (key_dir / "api-key").unlink()
    print(report)
    print(f"[start] results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
