"""The FlashAttention backend against the reference backend on the GPU (bf16, GQA 32/8, head_dim 128):
tests/support/suites/fa_backend.py, run on the real flash_attn.cute (the CPU suite runs it on the stand-in)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("flash_attn.cute")

from tests.support.backend_cases import GPU  # noqa: E402
from tests.support.suites.fa_backend import FaBackendSuite  # noqa: E402


@pytest.fixture
def env():
    return GPU


class TestFaOnKernels(FaBackendSuite):
    pass
