"""Machine classes users serve from, as the topology reader sees them (kit/topology.py).

Fixtures in tests/fixtures/lscpu/ are `lscpu -p=CPU,CORE,SOCKET,NODE,CACHE` texts: this VM's
own (recorded), and ones written in lscpu's format from the documented numbering of each
machine class (two-socket Xeon with SMT, a 96-core EPYC with 12 CCDs, a 16-core desktop with
adjacent SMT siblings, a 64-core two-node host seen from a container).
"""

from __future__ import annotations

from pathlib import Path

from kit.topology import Topology, parse_cpus, parse_topology

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lscpu"


def machine(name: str, allowed: str | None = None, quota: float | None = None) -> Topology:
    text = (FIXTURES / f"{name}.txt").read_text()
    return parse_topology(text, parse_cpus(allowed) if allowed else None, quota)


MACHINES = {
    "xeon-2s": machine("xeon-2s-28c-smt"),
    "epyc-96c": machine("epyc-96c-12ccd-smt"),
    "desktop-16c": machine("desktop-16c-smt-adjacent"),
    "container-8cpus-quota-4.5": machine("host-64c-2node", allowed="28-35", quota=4.5),
    "this-vm": machine("this-vm-2c"),
    "this-vm-taskset-1": machine("this-vm-2c", allowed="1"),
}


def bfloat16_param():
    """torch.bfloat16 as a test parameter, skipped on a CPU the kit refuses to serve bf16 on: its
    oneDNN kernels need AVX-512 (or AVX-NE-CONVERT), which an AVX2-only CPU lacks."""
    import pytest
    import torch

    from handlers.backends import DType, cpu_refusal

    refusal = cpu_refusal(DType.BFLOAT16)
    return pytest.param(torch.bfloat16, marks=pytest.mark.skipif(bool(refusal), reason=refusal))
