"""bench/generate/llama_cpp.py: how llama.cpp's server is built, fed and started, without building it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bench.generate import llama_cpp
from kit.topology import Cpu, Topology


def topology(flags: set[str]) -> Topology:
    cpus = tuple(Cpu(id=i, core=i, socket=0, node=0, l3=0) for i in range(4))
    return Topology(cpus=cpus, flags=frozenset(flags), model_name="Some CPU")


def test_a_cpu_with_other_instructions_gets_its_own_build():
    avx2, amx = topology({"avx2"}), topology({"avx2", "avx512f", "amx_tile"})
    assert llama_cpp.build_dir(avx2) != llama_cpp.build_dir(amx)
    assert llama_cpp.build_dir(avx2) == llama_cpp.build_dir(dataclasses.replace(avx2))


def test_the_gguf_is_converted_again_when_the_directory_changes(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"1")
    first = llama_cpp.gguf_path(tmp_path, "bf16")
    assert first == llama_cpp.gguf_path(tmp_path, "bf16") and first.name.endswith("-bf16.gguf")
    assert llama_cpp.gguf_path(tmp_path, "q8_0") != first
    (tmp_path / "model.safetensors").write_bytes(b"22")
    assert llama_cpp.gguf_path(tmp_path, "bf16") != first


def test_the_server_gets_the_kits_slots_each_with_the_kits_context_and_kv_precision():
    command = llama_cpp.server_command(
        Path("/b/llama-server"), Path("/m.gguf"), 8123, slots=8, context=2048, threads=6, kv_type="f32"
    )
    options = dict(zip(command[1::2], command[2::2], strict=False))
    assert options["--cache-type-k"] == options["--cache-type-v"] == "f32"
    assert options["--parallel"] == "8" and options["--ctx-size"] == str(8 * 2048)  # -c is shared by the slots
    assert options["--threads"] == "6" and options["--port"] == "8123" and options["--model"] == "/m.gguf"
