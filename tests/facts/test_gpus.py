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


def test_the_rules_family_predicates_are_the_tables():
    """rules.yaml's GPU family predicates (is_sm8x, is_hopper, is_sm100, is_sm120, is_blackwell; the rules read these,
    not sm_major) read ``sm_major``: on every architecture each is the table's family."""
    expected = {
        "is_sm8x": lambda gpu: gpu.family in ("ampere", "ada"),
        "is_hopper": lambda gpu: gpu.is_hopper,
        "is_sm100": lambda gpu: gpu.is_blackwell and gpu.major == 10,
        "is_sm120": lambda gpu: gpu.is_blackwell and gpu.major == 12,
        "is_blackwell": lambda gpu: gpu.is_blackwell,
    }
    predicates = [p for p in load_rules().predicates if p.name in expected]
    assert [p.name for p in predicates] == list(expected)
    for arch, gpu in GPUS.items():
        facts = {"sm_major": gpu.major}
        for predicate in predicates:  # each may read the ones before it
            facts[predicate.name] = predicate.condition(facts)
            assert facts[predicate.name] is expected[predicate.name](gpu), (arch, predicate.name)


def test_the_rules_read_the_family_predicates_not_sm_major():
    """Only the family predicates compare sm_major: a rule, invariant or deviation reads the family by name."""
    rules = load_rules()
    readers = [p.name for p in rules.predicates if "sm_major" in p.condition.text]
    others = [*rules.rules, *rules.invariants, *rules.deviations]
    readers += [item.id for item in others if "sm_major" in item.condition.text]
    assert readers == ["is_sm8x", "is_hopper", "is_sm100", "is_sm120"]
