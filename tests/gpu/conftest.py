"""GPU tests: every test here carries the ``gpu`` marker and is skipped where CUDA is absent.

Needs: a CUDA GPU (FA4's paged paths: SM90 or SM100), torch with CUDA, the ``gpu`` extra's kernels
(flashinfer-python 0.7.2.post1, flash-attn-4 4.0.0b36), transformers for test_transformers_plain.py and
test_runtime_on_kernels.py; test_two_gpus.py needs two GPUs (NCCL) and skips on one.

Run: ``python -m pytest -m gpu tests/gpu``. FlashInfer JIT-builds each kernel variant on first use (an SM90 fa3
prefill variant 70 to 100 s, decode and fa2 variants 10 to 20 s; FA4 2 to 3 s), so a cold run of the folder takes
about 17 minutes; where one command may run 10 minutes, run it in three groups on one host: test_transformers_plain.py
with test_runtime_on_kernels.py; test_flashinfer.py; the rest. The FP8 KV cache variants (FlashInfer's SM90 prefill
module does not compile for an FP8 cache, so the plan keeps FP8 caches on fa2) build with
``test_flashinfer.py -k "fp8 or kv_cache_dtype"``. Tests share variants (head dim, dtype, mask modes) where they can,
so that a new test adds as few builds as possible.
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
