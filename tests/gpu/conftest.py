"""GPU tests: every test here carries the ``gpu`` marker and is skipped where CUDA is absent.

A cold run on one GPU takes about 17 minutes, most of it FlashInfer JIT-building its kernel variants (fa3 prefill
variants 70 to 100 s each, decode and fa2 variants 10 to 20 s; FA4 2 to 3 s each): more than the 10 minutes of one
device call, so run it in three calls on one host (stage c, transformers, installed with stage b). Last full run,
2026-11-25, one H200 host (torch 2.11.0+cu130, flashinfer-python 0.7.2.post1, flash-attn-4 4.0.0b36, transformers
from stage c), cold:
- test_transformers_plain.py with test_runtime_on_kernels.py: 32 passed in 6:38 (two of them after their support
  imports were fixed, with test_flashinfer.py below);
- test_flashinfer.py (and test_transformers_plain.py's two cross-attention cases): 81 passed in 6:54;
- test_flashattention.py, test_plan_backend.py, test_page_ids.py, test_mla_and_local.py, test_standin_drift.py and
  test_kernel_facts.py: 190 passed in 3:45.
On the current layout (runtime/ under backends/), on one H200: test_page_ids.py with test_mla_and_local.py 41 passed
in 1:37, test_flashattention.py with test_plan_backend.py 95 passed in 2:42.
test_two_gpus.py needs two GPUs (skipped on one): 5 passed on 2 x H200, 2:11 cold, before the layout move.
The FP8 KV cache variants: FlashInfer 0.7.2's SM90 (fa3) prefill module does not compile for an FP8 cache, so the plan
keeps FP8 caches on fa2 (rule flashinfer.prefill-fa3-on-hopper); test_flashinfer.py -k "fp8 or kv_cache_dtype" builds them.
Tests share variants where they can (the same head dim, dtype and mask modes), so that a new test adds as few builds as
possible.
"""

from __future__ import annotations

import pytest


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not _cuda():
                item.add_marker(skip)
