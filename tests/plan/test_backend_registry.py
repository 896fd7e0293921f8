"""The backend registry (attngate/plan/backends.py): one table, the others derived from it, read without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attngate.errors import UsageError
from attngate.facts.choices import ATTENTION_BACKENDS
from attngate.plan.backends import (
    BACKENDS,
    CANDIDATE_BACKENDS,
    KERNEL_BACKEND_NAMES,
    UNKNOWN_PROVIDER,
    BackendEntry,
    backend_entry,
    kernel_provider,
)


def test_every_entry_is_an_attention_backend_name_once():
    names = [entry.name for entry in BACKENDS]
    assert len(names) == len(set(names)) and set(names) <= set(ATTENTION_BACKENDS)


def test_the_derived_tables():
    assert CANDIDATE_BACKENDS == ("fa3", "fa4", "flashinfer", "triton", "torch_native")
    assert KERNEL_BACKEND_NAMES == ("fa3", "fa4", "flashinfer")
    assert backend_entry("fa3").factory == backend_entry("fa4").factory  # one FA backend, its provider the plan's


def test_kernel_providers():
    assert kernel_provider("fa3") is None  # the plan's fa.provider names it
    assert kernel_provider("torch_native") == "torch SDPA"
    assert kernel_provider("trtllm_mla") == "flashinfer (trtllm-gen kernels)"
    assert kernel_provider("dsa") == UNKNOWN_PROVIDER


def test_an_unknown_name_is_refused_with_a_suggestion():
    with pytest.raises(UsageError, match="did you mean 'flashinfer'"):
        backend_entry("flashinfr")


def test_a_factory_comes_with_its_refusals():
    with pytest.raises(ValueError, match="go together"):
        BackendEntry("x", "y", factory="m:f")


def test_the_registry_and_the_refusals_import_no_torch():
    code = (
        "import sys, attngate.plan.backends, attngate.backends, attngate.backends.capabilities; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
