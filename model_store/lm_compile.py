"""`python -m model_store.lm_compile STAGING NAME SETTINGS`: a language model worker's start (load,
compile, warm-up: handlers/text_generation.py) in a process of its own, on the archive's staged
files and `handler:` SETTINGS (JSON); then the Inductor cache it filled (TORCHINDUCTOR_CACHE_DIR,
one of the build's own) and the whole graphs it compiled shipped into STAGING
(handlers/generation/compiled.py).

`python -m model_store.lm_compile --store DIR`: the same on every inductor language model archive
under DIR (DIR/<variant>/<model>/) that has no whole graphs for this process's Python, torch,
transformers and CPU, its graphs added to the archive. `make image` runs it in the image with the
image's Python: torch loads a whole graph only under the Python that saved it (to the patch
version), and without them every pod's first start compiles for minutes.

Exit REFUSED (3): the accuracy guard refused the model at its precision, its reason on stderr.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REFUSED = 3


def main(argv: list[str]) -> int:
    if argv[:1] == ["--store"]:
        return compile_store(Path(argv[1]))
    staging, name, settings = Path(argv[0]), argv[1], json.loads(argv[2])
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    from handlers.accuracy import AccuracyError
    from handlers.generation import compiled
    from handlers.outside_context import worker_context
    from handlers.text_generation import TextGenerationHandler

    handler = TextGenerationHandler()
    try:
        handler.initialize(worker_context(staging, name, settings))
    except AccuracyError as error:
        print(error, file=sys.stderr)
        return REFUSED
    shipped, whole = compiled.ship(compiled.cache_dir(), staging, handler.engine.model.forward)
    size = sum(path.stat().st_size for path in shipped.parent.rglob("*") if path.is_file())
    print(f"shipped {shipped.name} ({size / 1e6:.1f} MB; whole graphs: {', '.join(whole) or 'none'})")
    return 0


def start_command(staging: Path, name: str, settings: dict) -> list[str]:
    """A worker's start on the staged or archived files `staging`, in a process of its own (main)."""
    return [sys.executable, "-m", "model_store.lm_compile", str(staging), name, json.dumps(settings)]


def start_environment(cache: str, headers: Path) -> dict[str, str]:
    """The start's environment: the kit's, with Inductor's cache in `cache` (one of its own: what it
    fills is what is shipped) and the precompiled header at `headers`."""
    from handlers.backends.inductor import HEADERS_VAR
    from kit.paths import process_environment

    return {**process_environment(os.environ), "TORCHINDUCTOR_CACHE_DIR": cache, HEADERS_VAR: str(headers)}


def without_graphs(store: Path) -> list[Path]:
    """The archives under `store` of language models on Inductor with no whole graphs for this
    process's Python, versions and CPU."""
    from handlers.archive import archived_settings
    from handlers.archive_files import MANIFEST
    from handlers.backends import Backend, cpu_flags
    from handlers.generation.compiled import forward_dir
    from handlers.generation.settings import GenerationSettings

    archives = [manifest.parents[len(MANIFEST.parts) - 1] for manifest in sorted(store.glob(f"*/*/{MANIFEST}"))]
    flags = cpu_flags()
    return [
        archive
        for archive in archives
        if isinstance(settings := archived_settings(archive), GenerationSettings)
        and settings.backend is Backend.INDUCTOR
        and not forward_dir(archive, flags).is_dir()
    ]


def say(message: str) -> None:
    """To stderr: an image's build shows it where it hides the build's steps (podman build --quiet)."""
    print(f"[graphs] {message}", file=sys.stderr, flush=True)


def compile_store(store: Path) -> int:
    """Each archive `without_graphs` compiled by a worker's start in a process of its own (a
    process compiles one model: compiled.trace_settings) on a cache of its own, thrown away after:
    what it adds to the archive is its whole graphs and the kernels the archive lacked."""
    from handlers.archive import handler_section
    from handlers.archive_files import readable_by_all
    from handlers.backends.inductor import HEADERS
    from handlers.generation.compiled import DIRECTORY

    for archive in without_graphs(store):
        label = f"{archive.parent.name}/{archive.name}"
        say(f"{label}: compiling its whole graphs for Python {platform.python_version()}")
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="kit-compile-") as cache:
            done = subprocess.run(
                start_command(archive, archive.name, handler_section(archive)),
                env=start_environment(cache, Path(cache) / HEADERS),  # the header thrown away: never shipped
                capture_output=True,
                text=True,
            )
        if done.returncode:
            say(f"{label}: its worker's start failed (exit {done.returncode}); the end of its output:")
            say((done.stdout + done.stderr)[-4000:])
            return done.returncode
        readable_by_all(archive / DIRECTORY)  # torch saves whole graphs 0600; the image's workers are not root
        say(f"{label}: {done.stdout.strip().splitlines()[-1]}, in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
