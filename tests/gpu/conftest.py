"""GPU tests: every test here carries the ``gpu`` marker and is skipped where CUDA is absent.

A cold run on one H100 takes about 15 minutes, most of it FlashInfer JIT-building its kernel variants
(fa3 prefill variants 70 to 100 s each, decode and fa2 variants 10 to 20 s; FA4 2 to 3 s each):
test_flashinfer.py with test_page_ids.py 6 minutes cold (5:41 and 5:56 in two cold runs on an H100, 2
warm), test_flashattention.py with test_mla_and_local.py and test_standin_drift.py 4 after it on the same
host (FlashInfer's variants then built), test_transformers_plain.py 4. test_two_gpus.py
needs two GPUs (2 minutes on 2 x H200). Tests share variants where they can (the same head dim, dtype
and mask modes), so that a new test adds as few builds as possible. (Whole-file times measured before the suites
gained the encoder-token and window-layer CUDA-graph replay tests; those with the other graph tests of
test_flashinfer.py and test_mla_and_local.py, `-k graph`, took 3:41 cold on an H100, and FA's 1:09.)
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
