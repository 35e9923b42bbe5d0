"""handlers/generation/cache.py: what a position holds, as the plan counts it, equals what the
engine's cache keeps per position; the cache's memory is resident only where written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from handlers.generation.cache import KvShape, SlotCache, row_bytes
from handlers.generation.engine import Engine
from handlers.generation.runner import Part
from handlers.generation.sequences import Discard, Generation
from kit.paths import ROOT
from tests.hf_models import gpt2_lm, qwen2_lm

MB = 1 << 20


@pytest.mark.parametrize("family", [qwen2_lm, gpt2_lm], ids=["qwen2", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_rows_bytes_are_what_the_engine_allocates_per_sequence(family, dtype, tmp_path):
    directory = family(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(directory).eval().to(dtype)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    engine = Engine(model, tokenizer.decode, set(), slots=3, context=192, dtype=dtype)
    engine.submit(Generation((1, 2, 3), 2), Discard())
    while engine.busy:
        engine.step()
    # Three rows of the context and the scratch position: what the plan counts, and one position.
    assert engine.cache.bytes == 3 * row_bytes(model.config, 192 + 1, dtype) > 0


# The allocators a worker may preload (kit/layout.py's Allocator; their libraries in the venv's lib,
# where the launcher finds them), and the default: each its own process.
ALLOCATORS = {"default": None, "tcmalloc": "libtcmalloc.so", "jemalloc": "libjemalloc.so"}
RESIDENCY = """
import sys
import os
import subprocess
import sys
from pathlib import Path
import torch
from handlers.generation.cache import untouched_zeros

def resident():
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

maps = Path("/proc/self/maps").read_text()
before = resident()
zeros, _ = untouched_zeros((256, 1024, 256), torch.float32)  # 256 MB
assert float(zeros[100, 5, 7]) == 0.0
untouched = resident() - before
zeros[:64] = 1.0  # a quarter written
print(untouched, resident() - before, int(zeros.sum()), " ".join(sorted(set(maps.split()) & set(sys.argv[1:]))))
"""


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
def test_the_cache_is_resident_only_where_written_whatever_the_allocator(allocator):
    """The workers preload tcmalloc or jemalloc: tcmalloc's calloc writes what it hands out, which
    once made a whole cache resident before the first request."""
    env = dict(os.environ)
    library = ALLOCATORS[allocator]
    path = Path(sys.prefix) / "lib" / str(library)
    if library:
        assert path.is_file(), f"{path}: the kit's {allocator} is not installed"
        env["LD_PRELOAD"] = str(path)
    libraries = [str((Path(sys.prefix) / "lib" / name).resolve()) for name in ALLOCATORS.values() if name]
    run = subprocess.run(
        [sys.executable, "-c", RESIDENCY, *libraries], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    untouched, quarter, ones, *loaded = run.stdout.split()
    assert loaded == ([str(path.resolve())] if library else [])  # mapped: from /proc/self/maps
    assert int(ones) == 64 * 1024 * 256
    assert int(untouched) < 32 * MB
    assert 60 * MB < int(quarter) < 100 * MB


RELEASE = """
from pathlib import Path
import torch
from handlers.generation.cache import KvShape, SlotCache

def resident():
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

# A layer's row: 2 heads x 2048 positions (the context and the scratch one) x 64 x 4 bytes = 1 MiB.
cache = SlotCache(KvShape(layers=4, kv_heads=2, head_size=64), slots=4, context=2047, dtype=torch.float32)
cache.keys[:] = 1.0
cache.values[:] = 2.0
written = resident()
cache.release(1)
given_back = written - resident()
sums = [float(cache.keys[:, row].sum() + cache.values[:, row].sum()) for row in range(4)]
cache.keys[:, 1, :, :16] = 3.0  # written again: resident again, one page a head and layer
start, flags = cache.keys.data_ptr(), None
for line in Path("/proc/self/smaps").read_text().splitlines():
    head = line.split()[0]
    if "-" in head and all(c in "0123456789abcdef-" for c in head):
        low, high = (int(x, 16) for x in head.split("-"))
        inside = low <= start < high
    elif line.startswith("VmFlags:") and inside:
        flags = line.split()[1:]
print(given_back, resident() - written + given_back, "nh" in flags, *sums)
"""


def test_a_released_row_is_given_back_to_the_system_and_reads_as_zeros():
    """What kv_budget.py counts as given back is: the process's resident memory (from /proc) falls
    by the row's bytes, the row reads zeros, and the other rows keep what they hold. The mapping
    asks for small pages, so that a write makes its own page resident, not 2 MiB around it."""
    run = subprocess.run([sys.executable, "-c", RELEASE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    given_back, after_rewrite, no_huge_pages, *sums = run.stdout.split()
    given_back, after_rewrite, sums = float(given_back), float(after_rewrite), [float(s) for s in sums]
    # Small pages whatever the host's transparent huge pages (the mapping's VmFlags in /proc/self/smaps).
    assert no_huge_pages == "True"
    row = 4 * 2 * MB  # keys and values of 4 layers
    assert row * 0.95 < given_back < row * 1.05
    assert after_rewrite < row / 2
    held = 4 * 2 * 2048 * 64  # positions a row holds: keys of 1.0 and values of 2.0
    assert sums == [3.0 * held, 0.0, 3.0 * held, 3.0 * held]


def test_a_layer_whose_keys_differ_from_its_config_is_refused_by_name(tmp_path):
    config = AutoConfig.from_pretrained(qwen2_lm(tmp_path))
    shape = KvShape.of(config)
    cache = SlotCache(shape, slots=2, context=8, dtype=torch.float32)
    cache.select(slice(0, 1), torch.tensor([[4]]), 8)
    wrong = torch.zeros(1, shape.kv_heads + 1, 1, shape.head_size)
    with pytest.raises(ValueError, match=f"layer 0 computes keys of {shape.kv_heads + 1} heads"):
        cache.update(wrong, wrong, 0)


def next_token_distributions(model, ids: tuple[int, ...], dtype: torch.dtype, int8: bool) -> torch.Tensor:
    """Teacher-forced over `ids`: a prompt's part, then its last token as a decode step."""
    engine = Engine(model, str, set(), slots=2, context=96, dtype=dtype, kv_int8=int8)
    with torch.inference_mode():
        prompt = engine.runner.part(Part(1, ids[:-1], 0, last=False), every=True)
        step = engine.runner.decode([0, ids[-1]], [engine.cache.scratch, len(ids) - 1])[1:]
    return torch.cat([prompt, step]).float().softmax(-1)


@pytest.mark.parametrize("family", [qwen2_lm, gpt2_lm], ids=["qwen2", "gpt2"])
def test_an_int8_cache_is_as_close_to_the_float_one_as_bfloat16_compute_is(family, tmp_path):
    """Keys and values in int8, a float32 scale per head and position, read back (prompt and
    decode): each next-token distribution is as far from the float cache's as the same model
    computing in bfloat16 is (within 2x, mean total variation distance: int8 keeps 1/254 of each
    vector's largest, bfloat16 8 bits of mantissa), and the bytes a position holds are
    (head + 4) / (4 x head) of float32's."""
    directory = family(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = tuple(AutoTokenizer.from_pretrained(directory)("The committee postponed the vote until spring")["input_ids"])
    float_cache = next_token_distributions(model, ids, torch.float32, int8=False)
    int8_cache = next_token_distributions(model, ids, torch.float32, int8=True)
    bfloat16 = next_token_distributions(model.to(torch.bfloat16), ids, torch.bfloat16, int8=False)

    def distance(ours: torch.Tensor) -> float:
        return float((0.5 * (ours - float_cache).abs().sum(-1)).mean())

    assert 0 < distance(int8_cache) < 2 * distance(bfloat16), (distance(int8_cache), distance(bfloat16))
    assert (int8_cache.argmax(-1) == float_cache.argmax(-1)).float().mean() >= 0.9
    shape = KvShape.of(model.config)
    assert shape.token_bytes(torch.float32, int8=True) * 4 * shape.head_size == shape.token_bytes(torch.float32) * (
        shape.head_size + 4
    )
    cache = SlotCache(shape, slots=2, context=96, dtype=torch.float32, int8=True)
    assert cache.keys.dtype == torch.int8 and cache.bytes == 2 * row_bytes(
        model.config, 96 + 1, torch.float32, int8=True
    )
