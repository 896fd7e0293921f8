"""PlanBackend on the GPU (FA through flash_attn.cute for prefill, FlashInfer for decode, bf16, GQA 32/8, head_dim 128):
tests/support/suites/plan_backend.py on the real kernels (the CPU suite runs it on the stand-ins)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("flashinfer")
pytest.importorskip("flash_attn.cute")

from tests.support.backend_cases import GPU  # noqa: E402
from tests.support.suites.plan_backend import PlanBackendSuite  # noqa: E402


@pytest.fixture
def env():
    return GPU


class TestPlanBackendOnKernels(PlanBackendSuite):
    pass
