"""bench/generate/systems.py: a server that ends while starting is reported with its log, not
waited on for PEER_READY_S."""

from __future__ import annotations

import sys
import time

import pytest

from bench.generate import systems as generate_systems
from bench.generate.systems import ExitedAtStart, started


def test_a_server_that_exits_while_starting_is_reported_with_its_exit_code_and_log(tmp_path, monkeypatch):
    monkeypatch.setattr(generate_systems, "PEER_READY_S", 60)
    log_path = tmp_path / "peer.log"
    command = [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"]
    began = time.monotonic()
    with pytest.raises(ExitedAtStart, match=r"exited \(3\) while starting: .*peer\.log"):
        started("a peer", command, log_path, port=9)  # port 9 (discard): nothing answers there
    assert time.monotonic() - began < 30
    assert "no model here" in log_path.read_text()


@pytest.mark.parametrize(
    ("backend", "bf16", "expected"),
    [
        ("inductor", True, {"float32": "inductor", "bfloat16": "inductor-bf16", "int8": "inductor-bf16-woq"}),
        ("inductor", False, {"float32": "inductor"}),
        ("openvino", True, {"float32": "openvino", "bfloat16": "openvino-bf16", "int8": "openvino-bf16-woq"}),
        ("openvino", False, {"float32": "openvino"}),
    ],
)
def test_the_kit_has_a_row_per_precision_its_cpu_computes_int8_weights_in_bf16(monkeypatch, backend, bf16, expected):
    from handlers.backends import DType
    from kit import variant

    refusal = "" if bf16 else "no AVX512_BF16 or AMX"
    monkeypatch.setattr(variant, "cpu_refusal", lambda dtype: refusal if dtype is DType.BFLOAT16 else "")
    served = generate_systems.kit_variants(backend)
    assert served == expected
    for precision, name in served.items():
        settings = variant.Variant.load(name).settings
        assert settings.backend.value == backend
        assert (settings.weights.value == "int8") == (precision == generate_systems.INT8)


def test_every_precision_has_the_kits_kv_type_for_every_peer_not_their_defaults():
    # The kit's cache is in the dtype it computes in: float32, else bf16 (int8 weights compute in bf16).
    assert generate_systems.KV_TYPES == {"float32": "f32", "bfloat16": "bf16", "int8": "bf16"}
    peers_precisions = set().union(*(peer.precisions for peer in generate_systems.PEERS.values()))
    assert peers_precisions <= set(generate_systems.KV_TYPES)
