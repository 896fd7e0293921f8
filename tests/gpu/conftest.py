"""GPU tests: every test here carries the ``gpu`` marker and is skipped where CUDA is absent.

A cold run on one H100 takes about 15 minutes, most of it FlashInfer JIT-building its kernel variants
(fa3 prefill variants 70 to 100 s each, decode and fa2 variants 10 to 20 s; FA4 2 to 3 s each):
test_flashinfer.py 6 minutes cold (2 warm), test_standin_drift.py 3, test_flashattention.py with
test_mla_and_local.py 3.2, test_transformers_plain.py 4, test_page_ids.py seconds. test_two_gpus.py
needs two GPUs (2 minutes on 2 x H200). Tests share variants where they can (the same head dim, dtype
and mask modes), so that a new test adds as few builds as possible.
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
