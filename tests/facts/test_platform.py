"""Platform.from_name: architectures in every spelling SGLang users write, GPU product names, and nothing else."""

from __future__ import annotations

import sys

import pytest

from attngate import Platform, PlatformError


@pytest.mark.parametrize(
    "name, arch",
    [
        ("sm90", "sm90"),
        ("SM90", "sm90"),
        ("sm_90", "sm90"),
        ("90", "sm90"),
        ("9.0", "sm90"),
        ("10.0", "sm100"),
        ("12.1", "sm121"),
        ("H100", "sm90"),
        ("NVIDIA H200", "sm90"),
        ("A100", "sm80"),
        ("L40S", "sm89"),
        ("B200", "sm100"),
        ("RTX 5090", "sm120"),
        ("rtx-pro-6000", "sm120"),
    ],
)
def test_an_architecture_or_a_product_name_gives_its_architecture(name, arch):
    assert Platform.from_name(name).gpu_arch == arch


@pytest.mark.parametrize("name", ["1.0.0", "sm999", "9", "h1000", "90a", ""])
def test_anything_else_is_refused_naming_the_accepted_forms(name):
    with pytest.raises(PlatformError) as err:
        Platform.from_name(name)
    assert f"unknown GPU {name!r}" in str(err.value) and "h100" in str(err.value)


def test_sgl_kernels_fa3_counts_as_the_fa3_interface(monkeypatch):
    """In an SGLang process FA3 comes from sgl_kernel.flash_attn: detection finds it and names the module."""
    import types

    from attngate.facts.platform import installed_kernel_modules, installed_kernel_providers

    monkeypatch.setitem(sys.modules, "sgl_kernel", types.ModuleType("sgl_kernel"))
    monkeypatch.setitem(sys.modules, "sgl_kernel.flash_attn", types.ModuleType("sgl_kernel.flash_attn"))
    # FlashAttention-3's own package, which is found first, as absent here (find_spec answers None for a None entry)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    modules = installed_kernel_modules()
    assert modules["flash_attn_interface"] == "sgl_kernel.flash_attn"
    assert "flash_attn_interface" in installed_kernel_providers()
