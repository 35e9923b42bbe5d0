"""The kit's C++ kernels for language models, compiled once and loaded: the row kernels of linear
layers (row_kernels.cpp, row_linear.py) and a decode row's attention (decode_attention.cpp,
attention.py), one library of `torch.ops.kit_rows` operators.

    if library() is not None:                       # built (once) and loaded into this process
        torch.ops.kit_rows.linear(...)
    .venv/bin/python -m handlers.generation.native  # build it now (the image does)

The library is compiled from its C++ sources once per sources, torch and compiler (23 s on a
2-core EPYC) into the kit's kernel directory (KERNELS_VAR: .cache/kernels for every process the
kit starts, a directory of the image's own in the image) and loaded from there; where it cannot
be built, the layers stay on oneDNN and sdpa, and the log says why.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = (Path(__file__).with_name("row_kernels.cpp"), Path(__file__).with_name("decode_attention.cpp"))
KERNELS_VAR = "KIT_KERNELS_DIR"
FLAGS = ["-O3", "-fopenmp"]  # at::parallel_for is OpenMP's, inlined from torch's headers (torch's libgomp)


@functools.cache
def library() -> Path | None:
    """The compiled library, loaded into this process; None (and why, in the log) if it cannot be."""
    try:
        path = kernels_dir() / f"kit_rows-{digest()}.so"
        if not path.is_file():
            build(path)
        torch.ops.load_library(str(path))
        return path
    except Exception as error:  # no compiler, a read-only directory, a torch without headers
        log.warning("the kit's kernels are not available (%s): linear layers stay on oneDNN, attention on sdpa", error)
        return None


def loaded() -> bool:
    """Whether library() has loaded the library into this process (none is built or loaded here)."""
    return library.cache_info().currsize > 0 and library() is not None


@contextlib.contextmanager
def live_rows(rows: int) -> Iterator[None]:
    """Within the block the library's products compute only their inputs' first `rows` rows and
    leave the others' outputs zero (0: every row): a decode step's idle rows (runner.py)."""
    if not rows or not loaded():
        yield
        return
    torch.ops.kit_rows.set_live_rows(rows)
    try:
        yield
    finally:
        torch.ops.kit_rows.set_live_rows(0)


def kernels_dir() -> Path:
    return Path(os.environ.get(KERNELS_VAR) or Path(tempfile.gettempdir()) / "kit-kernels")


def digest() -> str:
    """What the library depends on: its sources, torch (headers and ABI), the flags, the compiler."""
    parts = [*(source.read_bytes() for source in SOURCES), torch.__version__.encode(), " ".join(FLAGS).encode()]
    parts.append(compiler().encode())
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def compiler() -> str:
    return shutil.which(os.environ.get("CXX", "c++")) or os.environ.get("CXX", "c++")


def build(path: Path) -> None:
    """Compiled into a file of its own, then renamed into place: workers starting together each
    build, and the last rename wins with the same bytes. The compiler is called as torch's
    cpp_extension would call it, without its ninja (not in every environment the kit serves from)."""
    from torch.utils.cpp_extension import include_paths, library_paths

    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    staging = path.with_name(f".build-{os.getpid()}-{path.name}")
    command = [
        compiler(),
        *FLAGS,
        "-shared",
        "-fPIC",
        "-std=c++20",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{p}" for p in include_paths()),
        *(str(source) for source in SOURCES),
        "-o",
        str(staging),
        *(f"-L{p}" for p in library_paths()),
        "-lc10",
        "-ltorch_cpu",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            names = " and ".join(source.name for source in SOURCES)
            raise RuntimeError(f"compiling {names} failed: {(done.stderr or done.stdout).strip()[-600:]}")
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)
    log.info("built the kit's kernels in %.0f s: %s", time.monotonic() - started, path)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="[kernels] %(message)s")
    path = library()
    if path is None:
        print("[kernels] not built (the warning above says why): linear layers stay on oneDNN, attention on sdpa")
        return 1
    print(f"[kernels] {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
