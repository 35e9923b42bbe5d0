"""The backend registry: every backend declared once, with a module that builds it and a variant that selects it."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from handlers.backends import (
    BACKENDS,
    Backend,
    BatchSizes,
    batch_buckets,
    bf16_isa,
    builder,
    cpu_flags,
    cpu_isas,
    int8_refusal,
    precompiler,
)
from kit.paths import ROOT
from kit.variant import Variant, variant_names


@pytest.mark.parametrize("backend", list(Backend))
def test_every_backend_has_traits_and_a_builder(backend):
    traits = BACKENDS[backend]
    build = builder(backend)
    assert list(inspect.signature(build).parameters) == ["model", "settings", "spec"], build
    if traits.precompiled:
        params = list(inspect.signature(precompiler(backend)).parameters)
        assert params[:5] == ["model", "settings", "example_of", "calibration", "out_dir"]
    else:
        assert traits.batch_sizes is BatchSizes.BUCKETS  # packaged sizes exist only at archive time


def test_a_language_models_backends_each_name_an_engine_the_handler_makes():
    from handlers.generation.settings import GENERATION_BACKENDS
    from handlers.text_generation import TextGenerationHandler

    engines = {b: t.generation_engine for b, t in BACKENDS.items() if t.generation_engine}
    assert {b.value for b in engines} == GENERATION_BACKENDS
    assert {"eager", "inductor", "openvino"} <= GENERATION_BACKENDS
    for backend, method in engines.items():
        assert inspect.isfunction(getattr(TextGenerationHandler, method, None)), f"{backend}: {method}"


def test_every_backend_is_selected_by_a_variant():
    selected = {Variant.load(name).backend for name in variant_names()}
    assert selected == set(Backend), f"backends without a config/variants/*.yaml: {set(Backend) - selected}"


def test_the_serving_side_and_plans_are_read_without_torch():
    # Every module of kit/ (the server, planner, registries) and reading a bench plan: torch and
    # the peers' servers cost seconds of import and belong to workers and bench children.
    kit_modules = sorted(f"kit.{path.stem}" for path in (ROOT / "kit").glob("*.py") if path.stem != "__init__")
    code = (
        f"import sys, handlers.backends, handlers.settings, bench.plan, {', '.join(kit_modules)}; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'litserve')); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_the_isa_table_reads_this_cpu_as_torch_does():
    """The kit's ISA names (from /proc/cpuinfo) decide whether an AOTI package runs and bf16 is
    served; torch's own checks must agree on this machine, whichever CPU it is."""
    import torch

    here = cpu_isas(cpu_flags())
    torch_says = {
        "AVX2": torch.cpu._is_avx2_supported(),
        "AVX512": torch.cpu._is_avx512_supported(),
        "AVX512_VNNI": torch.cpu._is_vnni_supported(),
        "AVX512_BF16": torch.cpu._is_avx512_bf16_supported(),
        "AMX_TILE": torch.cpu._is_amx_tile_supported(),
    }
    assert {isa: isa in here for isa in torch_says} == torch_says


def test_an_isa_needs_all_its_flags():
    assert cpu_isas({"avx2", "fma", "avx512f"}) == ("AVX2",)  # AVX512 also needs bw, vl, dq
    assert bf16_isa({"avx2", "fma", "avx512_vnni"}) is None
    assert bf16_isa({"amx_tile", "amx_bf16", "avx512_bf16"}) == "AMX_BF16"
    # Flags read once, as from a generator over /proc/cpuinfo's line: the second ISA is still seen.
    assert bf16_isa(iter(["avx512f", "avx512_bf16"])) == "AVX512_BF16"


@pytest.mark.parametrize(
    ("judged_on", "here", "refused"),
    [
        (("AVX2", "AVX512", "AVX512_VNNI"), ("AVX2", "AVX512"), True),  # Cascade Lake's build on a Skylake
        (("AVX2", "AVX_VNNI"), ("AVX2",), True),  # 32-bit sums without AVX-512 too
        (("AVX2",), ("AVX2", "AVX512", "AVX512_VNNI"), False),  # saturating build, exact server
        (("AMX_INT8", "AVX512_VNNI"), ("AVX512_VNNI",), False),  # both sum in 32 bits
        (("AVX2",), ("AVX2",), False),
        ((), ("AVX2",), False),  # an archive that does not say
    ],
)
def test_int8_is_refused_where_its_products_would_saturate_and_did_not_when_judged(judged_on, here, refused):
    said = int8_refusal(judged_on, here)
    assert bool(said) is refused
    if refused:
        assert "judged on a CPU that sums int8 products in 32 bits" in said and "make archive" in said


@pytest.mark.parametrize(("max_batch", "buckets"), [(1, [1]), (3, [1, 2, 3]), (8, [1, 2, 4, 8]), (6, [1, 2, 4, 6])])
def test_batch_buckets(max_batch, buckets):
    assert batch_buckets(max_batch) == buckets
