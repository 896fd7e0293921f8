"""The FlashInfer backend against the reference backend on the GPU (bf16, GQA 32/8, head_dim 128):
tests/support/suites/flashinfer_backend.py, run on the real kernels (the CPU suite runs it on the stand-in)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("flashinfer")

from tests.support.backend_cases import GPU  # noqa: E402
from tests.support.suites.flashinfer_backend import FlashInferBackendSuite  # noqa: E402


@pytest.fixture
def env():
    return GPU


class TestFlashInferOnKernels(FlashInferBackendSuite):
    pass
