"""PlanBackend on the GPU (FA through flash_attn.cute for prefill, FlashInfer for decode, bf16, GQA 32/8, head_dim 128):
tests/suites/plan_backend.py on the real kernels (the CPU suite runs it on the stand-ins)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("flashinfer")
pytest.importorskip("flash_attn.cute")

from backend_cases import GPU  # noqa: E402
from suites.plan_backend import *  # noqa: E402,F401,F403


@pytest.fixture
def env():
    return GPU
