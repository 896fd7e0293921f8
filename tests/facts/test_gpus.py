"""The one GPU table (attngate.facts.gpus): each architecture's name, ``sm_major`` and product names derive from its
capability row, and the rules' family predicate agrees with the table's."""

from __future__ import annotations

import pytest

from attngate import Platform
from attngate.facts.gpus import GPU_ARCHS, GPUS
from attngate.facts.platform import GPU_PRODUCTS, sglang_kernels
from attngate.rules.load import load_rules


@pytest.mark.parametrize("arch", GPU_ARCHS)
def test_an_architecture_is_its_capability_in_every_spelling(arch):
    gpu = GPUS[arch]
    major, minor = gpu.capability
    for spelling in (arch, f"{major}.{minor}", f"{major}{minor}", f"sm_{major}{minor}", *gpu.products):
        platform = Platform.from_name(spelling)
        assert (platform.gpu_arch, platform.sm_major) == (arch, major), spelling


def test_product_names_are_the_tables():
    assert GPU_PRODUCTS == {product: gpu.name for gpu in GPUS.values() for product in gpu.products}
    assert len(GPU_PRODUCTS) == sum(len(gpu.products) for gpu in GPUS.values())  # no product under two rows


def test_the_families():
    assert [a for a in GPU_ARCHS if GPUS[a].is_hopper] == ["sm90"]
    assert [a for a in GPU_ARCHS if GPUS[a].is_blackwell] == ["sm100", "sm103", "sm120", "sm121"]
    assert [a for a in GPU_ARCHS if "flash_attn_interface" in sglang_kernels(a)] == ["sm80", "sm86", "sm89", "sm90"]


def test_the_rules_is_blackwell_predicate_is_the_tables():
    """rules.yaml's ``is_blackwell`` predicate reads ``sm_major``: on every architecture it is the table's family."""
    (predicate,) = [p for p in load_rules().predicates if p.name == "is_blackwell"]
    for arch, gpu in GPUS.items():
        assert predicate.condition({"sm_major": gpu.major}) is gpu.is_blackwell, arch
