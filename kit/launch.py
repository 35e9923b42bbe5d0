"""How the kit starts one TorchServe: the command line and the environment of its processes.

    launch = Launch(config, venv, run_dir, tmp_dir, layout)
    subprocess.Popen(launch.command(config_file, model_store), env=launch.environment())

With a planned layout (placement plan) the frontend runs under `taskset` on its planned CPUs,
and starts every worker through kit/pin_worker.py, which pins it and then becomes it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from kit import pin_worker
from kit.layout import Layout
from kit.paths import CONFIG, process_environment
from kit.properties import worker_environment
from kit.serve_config import ServeConfig
from kit.topology import format_cpus

LOG_CONFIG = CONFIG / "log4j2.xml"
LAYOUT_FILE = "layout.json"  # the planned layout, read by every worker's kit/pin_worker.py
# The torchserve command, with the "python" the frontend starts workers with replaced by
# kit/pin_worker.py: the CLI passes its own sys.executable to the frontend (`--python`), and
# neither the config file nor the environment can override that.
TORCHSERVE_PINNED = (
    "import sys; from ts.model_server import start; "
    "sys.executable = sys.argv.pop(1); sys.argv[0] = 'torchserve'; sys.exit(start())"
)
PIN_WORKER = Path(pin_worker.__file__).resolve()


@dataclasses.dataclass(frozen=True)
class Launch:
    config: ServeConfig
    venv: Path  # the variant's Python environment
    run_dir: Path
    tmp_dir: Path
    layout: Layout | None  # placement plan only

    def frontend_cpus(self) -> set[int] | None:
        """Where the Java frontend runs: its planned CPUs, or `cpus`; None = unrestricted."""
        if self.layout:
            return set(self.layout.frontend_cpus)
        return self.config.allowed_cpus if self.config.cpus else None

    def environment(self) -> dict[str, str]:
        env = process_environment(dict(os.environ))
        env.update(
            # The frontend's launcher check runs the bare `python`: the venv must come first.
            PATH=f"{self.venv / 'bin'}:{env.get('PATH', '')}",
            # run_cpu looks for libjemalloc.so / libtcmalloc.so in $VIRTUAL_ENV/lib.
            VIRTUAL_ENV=str(self.venv),
            # TorchServe's pid file, extracted archives and worker sockets go under TMPDIR/TEMP.
            TMPDIR=str(self.tmp_dir),
            TEMP=str(self.tmp_dir),
            LOG_LOCATION=str(self.run_dir),
            METRICS_LOCATION=str(self.run_dir),
        )
        env.update(worker_environment(self.config))
        if self.layout:  # each model's allocator is in the layout
            env.update(
                {
                    pin_worker.LAYOUT_VAR: str(self.run_dir / LAYOUT_FILE),
                    pin_worker.PYTHON_VAR: str(self.venv / "bin" / "python"),
                    pin_worker.ALLOCATOR_DIR_VAR: str(self.venv / "lib"),
                }
            )
        return env

    def command(self, config_file: Path, model_store: Path) -> list[str]:
        cpus = self.frontend_cpus()
        pin = ["taskset", "-c", format_cpus(cpus)] if cpus else []  # workers re-pin themselves (plan)
        if self.layout:
            torchserve = [str(self.venv / "bin" / "python"), "-c", TORCHSERVE_PINNED, str(PIN_WORKER)]
        else:
            torchserve = [str(self.venv / "bin" / "torchserve")]
        return [
            *pin,
            *torchserve,
            "--start",
            "--foreground",  # we own the process: its group is ours to stop
            "--ncs",  # no config snapshots: every start is exactly the rendered config
            "--ts-config",
            str(config_file),
            "--model-store",
            str(model_store),
            "--log-config",
            str(LOG_CONFIG),
        ]
