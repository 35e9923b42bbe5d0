"""llama.cpp's server as a peer of PLAN=generate, on the same weights as the kit.

    .venv/bin/python -m bench.generate.llama_cpp build              # once per machine: minutes
    .venv/bin/python -m bench.generate.llama_cpp convert DIR bf16   # -> .cache/peers/gguf/<...>.gguf

PyPI's llama-cpp-python carries the llama.cpp tree it binds (its sdist's vendor/llama.cpp): the
C++ server (`llama-server`: parallel slots, continuous batching, OpenAI's API) and the converter
from a Hugging Face directory to GGUF. The wheel's own Python server answers one request at a
time, which is not what a user of llama.cpp runs, so the bench builds `llama-server` from that
tree, native to this CPU (GGML_NATIVE: AVX-512, VNNI, AMX where present), and serves with it.
Everything lands in .cache/peers/, outside `make test`: the build alone takes minutes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tarfile
from pathlib import Path

from bench.generate import peer_setup
from bench.generate.peer_setup import PEERS
from kit.paths import ROOT
from kit.topology import Topology, read_topology

VERSION = "0.3.36"  # llama-cpp-python
SDIST = f"llama_cpp_python-{VERSION}"
SERVER = "llama-server"
NO_REPACK = "--no-repack"  # weights as stored: no AMX or other repacked kernels
# The converter's output type per precision of a row (bench/generate/systems.py): int8 weights are Q8_0.
GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "int8": "q8_0"}
# The web UI would be fetched from the network; TLS and the model downloader are not used here.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)


def log(message: str) -> None:
    print(f"[llama.cpp] {message}", flush=True)


def run(command: list[str], what: str, log_file: Path, **options) -> None:
    peer_setup.run(command, what, log_file, log, **options)


def source_tree() -> Path:
    """llama.cpp's tree from llama-cpp-python's sdist, downloaded and unpacked once."""
    tree = PEERS / SDIST / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    PEERS.mkdir(parents=True, exist_ok=True)
    download = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--dest",
        str(PEERS),
        f"llama-cpp-python=={VERSION}",
    ]
    run(download, f"downloading llama-cpp-python {VERSION}'s source from PyPI", PEERS / "download.log")
    with tarfile.open(PEERS / f"{SDIST}.tar.gz") as archive:
        archive.extractall(PEERS, filter="data")
    return tree


def build_dir(topology: Topology) -> Path:
    # Native code runs only where it was built: a build per CPU model and ISA.
    cpu = hashlib.sha256(f"{topology.model_name} {sorted(topology.flags)}".encode()).hexdigest()[:12]
    return PEERS / f"llama.cpp-{VERSION}-{cpu}"


def server_binary(topology: Topology | None = None) -> Path:
    """`llama-server` built for this CPU, building it first if it is not there."""
    topology = topology or read_topology()
    build = build_dir(topology)
    binary = build / "bin" / SERVER
    if binary.is_file():
        return binary
    tree = source_tree()
    build.mkdir(parents=True, exist_ok=True)
    jobs = str(topology.capacity)
    run(["cmake", "-S", str(tree), "-B", str(build), *CMAKE_OPTIONS], "configuring llama.cpp", build / "configure.log")
    run(
        ["cmake", "--build", str(build), "--target", SERVER, "-j", jobs],
        f"building {SERVER} on {jobs} cores (minutes)",
        build / "build.log",
    )
    return binary


def gguf_path(model_dir: Path, gguf_type: str) -> Path:
    return PEERS / "gguf" / f"{peer_setup.derived(model_dir, VERSION)}-{gguf_type}.gguf"


def convert(model_dir: Path, gguf_type: str) -> Path:
    """The model directory as GGUF of `gguf_type` (f32, bf16, q8_0), by llama.cpp's own converter."""
    out = gguf_path(model_dir, gguf_type)
    if out.is_file():
        return out
    tree = source_tree()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    command = [
        sys.executable,
        "-m",
        "bench.generate.gguf_convert",
        str(tree),
        str(model_dir),
        "--outtype",
        gguf_type,
        "--outfile",
        str(partial),
    ]
    run(command, f"converting {model_dir} to GGUF {gguf_type}", out.with_suffix(".log"), cwd=ROOT)
    os.replace(partial, out)
    return out


def server_command(
    binary: Path, gguf: Path, port: int, slots: int, context: int, threads: int, kv_type: str
) -> list[str]:
    """How a user serves many streams with llama.cpp: `slots` parallel sequences of `context`
    tokens each (-c is shared among the slots), continuous batching (on by default), this
    machine's cores as threads, keys and values held as `kv_type`."""
    return [
        str(binary),
        "--model",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        str(slots),
        "--ctx-size",
        str(slots * context),
        "--threads",
        str(threads),
        "--cache-type-k",
        kv_type,
        "--cache-type-v",
        kv_type,
        "--no-webui",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help=f"build {SERVER} for this CPU").set_defaults(act=lambda _: server_binary())
    to_gguf = commands.add_parser("convert", help="convert a Hugging Face directory to GGUF")
    to_gguf.add_argument("model_dir", type=Path)
    to_gguf.add_argument("gguf_type", choices=sorted(set(GGUF_TYPES.values())))
    to_gguf.set_defaults(act=lambda args: convert(args.model_dir, args.gguf_type))
    args = parser.parse_args(argv)
    print(args.act(args))
    return 0


if __name__ == "__main__":
    if shutil.which("cmake") is None:
        sys.exit("[llama.cpp] ERROR: cmake is not installed: apt-get install cmake g++ (or make install)")
    sys.exit(main())
