"""torch.compile with Inductor and weight freezing, compiled in the worker by its warm-up calls.

run = build(prepared, settings, spec)   # compiles lazily: the first call per shape
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
from torch import nn

from handlers.backends import CPUINFO, cpuinfo
from handlers.backends.common import BuildSpec, Runner, mark_varying
from handlers.settings import LinearKernel, OptimizationSettings


def cpu_vendor(path: Path = CPUINFO) -> str:
    """ "GenuineIntel", "AuthenticAMD", ... ("" where /proc/cpuinfo has no vendor_id)."""
    return cpuinfo(path).get("vendor_id", "")


def linear_kernel(setting: LinearKernel, vendor: str) -> LinearKernel:
    if setting is not LinearKernel.AUTO:
        return setting
    return LinearKernel.MKL if vendor == "GenuineIntel" else LinearKernel.ONEDNN


@functools.cache
def _patch_linear_packing() -> type:
    """Let Inductor pack frozen float32 linears for oneDNN (mkldnn._linear_pointwise), not MKL.

    Its weight-packing pass (torch 2.13, fx_passes/mkldnn_fusion.py) packs float32 linears for
    MKL unless the weight is low-precision or it compiles ahead of time (AOTInductor), where it
    takes oneDNN's op. Its two methods use the low-precision flag only for that choice, so the
    patched ones pass True while the class's `onednn_linear` is set. tests/unit/handlers/test_optimize.py
    checks the op that runs: a torch upgrade that moves this fails there.
    """
    from torch._inductor.fx_passes import mkldnn_fusion

    device_op = mkldnn_fusion.CpuMkldnnDeviceOp
    pack_weight, pack = device_op.pack_linear_weight, device_op.pack_linear

    def pack_linear_weight(self, graph, is_lp_weight, transpose_weight_node, batch_size):
        return pack_weight(self, graph, is_lp_weight or self.onednn_linear, transpose_weight_node, batch_size)

    def pack_linear(self, graph, is_lp_weight, batch_size, input, packed_weight_node, bias):
        return pack(self, graph, is_lp_weight or self.onednn_linear, batch_size, input, packed_weight_node, bias)

    device_op.pack_linear_weight, device_op.pack_linear = pack_linear_weight, pack_linear
    device_op.onednn_linear = False
    return device_op


def select_linear_kernel(kernel: LinearKernel) -> None:
    """For every later compile in this process (a worker serves one model)."""
    _patch_linear_packing().onednn_linear = kernel is LinearKernel.ONEDNN


# Inductor's precompiled C++ header, in its compile cache (what a start finds again), or where
# HEADERS_VAR says: a build, which compiles into a cache of its own, leaves its header in the
# kit's, where the workers of the machine that ran `make model` find it at their first start.
HEADERS = "precompiled_headers"
HEADERS_VAR = "KIT_INDUCTOR_HEADERS"


def headers_in_cache() -> None:
    """Inductor's precompiled C++ header kept in the compile cache (TORCHINDUCTOR_CACHE_DIR), for
    every later start, process-wide.

    torch 2.13 keeps it under the temporary directory (`codecache._HEADER_DIR`, fixed at import)
    and compiles it before it looks for a kernel's library, even when the cache has that library.
    A worker's temporary directory is its server's, deleted when the server stops: every start
    compiled the header again (147 MB, 8.9 s of g++) although the archive brought every library,
    a third of a 29 s start of Qwen2.5-0.5B's shape (2-core AMD EPYC Zen 3). A cache moved to
    another CPU finds the header under the same name (torch hashes the command line, whose
    `-march=native` reads alike everywhere); gcc documents that it then ignores a header built
    for other target options and compiles without it (not tried here: one CPU)."""
    from torch._inductor import codecache
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    headers = Path(os.environ.get(HEADERS_VAR) or Path(cache_dir()) / HEADERS)
    codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR = str(headers), str(headers / "locks")


def inductor_options(settings: OptimizationSettings) -> dict:
    """Inductor's options for the settings' mode (torch.compile takes `mode` or `options`, not both)."""
    options = torch._inductor.list_mode_options(settings.mode.value)
    options.pop("triton.cudagraphs", None)  # a GPU feature; meaningless on CPU
    return options


def build(model: nn.Module, settings: OptimizationSettings, spec: BuildSpec) -> Runner:
    # Freezing (weights as constants: conv-BN folding, prepacked oneDNN weights) is read when AOT
    # Autograd compiles, lazily inside the first calls and outside torch.compile(options=...)'s
    # scope: passed there it is silently ignored (torch 2.13). A worker process serves one model,
    # so it is set process-wide: recompiles get it too, serving calls pay nothing for it, and the
    # minifier's repro scripts (which record the global config) reproduce it.
    torch._inductor.config.freezing = True
    headers_in_cache()
    select_linear_kernel(linear_kernel(settings.linear_kernel, cpu_vendor()))  # process-wide too
    # dynamic=False: no shape becomes dynamic by surprise; the sizes that vary are marked below.
    compiled = torch.compile(model, backend="inductor", options=inductor_options(settings), dynamic=False)
    # Text lengths and batch sizes: one graph with these sizes dynamic ran every length and batch
    # as fast as one frozen graph per shape did (BERT-base 16-128 tokens, ResNet-50 and BERT at
    # batch 2 and 4, one thread), and each graph holds its own copy of the frozen weights (+345 MB
    # per BERT shape). A batch of 1 still gets its own graph: torch specializes sizes of 1.
    dims = tuple(settings.varying_dims()) + ((0,) if len(spec.batch_sizes) > 1 else ())  # once: the hot path
    if not dims:
        return compiled

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        return compiled(*mark_varying(inputs, dims))

    return run
