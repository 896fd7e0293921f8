"""The GPU backend suites (tests/suites) on the CPU, through the kernel stand-ins (tests/standins):
FlashInfer's and FA's metadata code, CUDA-graph replay (emulated), split-KV batch invariance."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("torch")

from backend_cases import CPU  # noqa: E402
from standins import flash_attn_cute, flashinfer  # noqa: E402
from suites.dp_padding import *  # noqa: E402,F401,F403
from suites.fa_backend import *  # noqa: E402,F401,F403
from suites.flashinfer_backend import *  # noqa: E402,F401,F403
from suites.plan_backend import *  # noqa: E402,F401,F403


@pytest.fixture(autouse=True)
def kernels(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer.module())
    for name, module in flash_attn_cute.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(flash_attn_cute, "ARCH", CPU.platform().sm_major)  # the suites' plans are an H100's: its limits hold


@pytest.fixture
def env():
    return CPU
