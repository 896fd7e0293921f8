"""GPU tests: every test here carries the ``gpu`` marker and is skipped where CUDA is absent.

A cold run on one H100 takes about 15 minutes, most of it FlashInfer JIT-building its kernel variants
(fa3 prefill variants 70 to 100 s each, decode and fa2 variants 10 to 20 s; FA4 2 to 3 s each): more than the
10 minutes of one device call, so run it in four calls, in this order (stage c, transformers, installed before the second).
Last full run, 2026-11-24 (second session), one fresh H100 80GB HBM3 host, cold:
- test_plan_backend.py with test_flashattention.py: 93 passed in 3:35;
- test_runtime_on_kernels.py with test_transformers_plain.py: 30 passed in 5:27;
- test_flashinfer.py: 75 passed in 4:37;
- test_mla_and_local.py, test_standin_drift.py and test_page_ids.py: 86 passed in 1:05.
After the capture checks became one shared UsageError check (commit dbb2639), on another fresh H100 host: test_plan_backend.py,
test_flashattention.py and test_flashinfer.py -k "graph or replay or capture" 48 passed in 4:54 (cold).
After flash_attn.cute's limits became kernel facts (commit 743a4cb), on a fresh H100 host (session of 2026-11-24, third):
test_kernel_facts.py, test_flashattention.py and test_plan_backend.py 100 passed in 3:59 (cold); test_standin_drift.py
and test_mla_and_local.py 74 passed in 4:45. After flashinfer.head-dims (commit ab43117), on another fresh H100 host:
test_kernel_facts.py with test_flashinfer.py -k encoder_only 12 passed in 3:20 (cold). After the flash_attn.cute stand-in
took on the kernel's architecture limits, on a third fresh H100 host: test_kernel_facts.py (stand-in beside kernel) and
test_standin_drift.py 52 passed in 6:24 (cold). Then on a fourth fresh H100 host: test_flashinfer.py 75 passed in 6:04
(cold); test_runtime_on_kernels.py, test_transformers_plain.py and test_page_ids.py 42 passed in 4:01. With the runs
above, every file of tests/gpu passed after this session's changes: test_two_gpus.py 5 passed in 2:11 on 2 x H200 (cold).
test_two_gpus.py needs two GPUs (skipped on one): 5 passed in 2:44 on 2 x H200 (cold host, 2026-11-23).
After the plain transformers path took torch.compile (an attention call on a GPU kernel is the custom op
attngate::plain_kernel_attention, commit after d6521db), session of 2026-11-24 (fourth), on torch 2.11.0 and transformers
5.17.0: test_transformers_plain.py 8 passed in 4:20 (the compiled, Llama, DeepSeek-V3 and Mllama cases, cold) and on a
fresh H100 host the other 16 passed in 2:26; tests/integrations/test_transformers_plain.py -k compile on the same hosts
(CPU tests, torch 2.11) 7 passed; its chunked-local case failed inside transformers 5.17's generate() (its
create_masks_for_generate hands create_chunked_causal_mask a block_sequence_ids it does not take): CI's 5.23 runs it.
After a mask's valid positions became shared by the layers of a forward: test_transformers_plain.py 24 passed in 6:47 on
another fresh H100 host (cold); after the last change to its chunked-local and cross rows (commit d46356c), on a third:
-k "mllama or whisper or llama4 or bidirectional or compiled" 7 passed in 3:10 (cold).
After CUDA-graph decode replays moved to FlashInfer's fast_decode_plan (rule flashinfer.graph-decode-fast-replan, session of
2026-11-24, fifth), on one fresh H100 host: test_flashinfer.py 77 passed in 6:14 (cold, after bench_host.py), then
test_standin_drift.py, test_page_ids.py, test_plan_backend.py and test_mla_and_local.py -k "flashinfer or fi_ or standin or
drift or page or mla or graph" 90 passed in 2:49. After eager decode at page 1 moved to fast_decode_plan too, on another
fresh H100 host: test_flashinfer.py and test_standin_drift.py -k "replan or decode or graph or replay" 45 passed in 4:10
(cold, after bench_host.py), then test_plan_backend.py, test_runtime_on_kernels.py and test_flashinfer.py -k "flashinfer
or fi_" 82 passed in 3:31. After the re-plan code became _replans_fast / _fast_plan_arrays (commit f701bb1), on a fourth
fresh H100 host: test_flashinfer.py, test_standin_drift.py and test_page_ids.py -k "replan or decode or graph or replay or
page" 60 passed in 5:08 (cold); on a fifth, test_standin_drift.py -k "reject or lse" (fast_decode_plan's rejections beside
plan()'s) 5 passed in 1:13 (cold); on a sixth, after the tests' with_gate helper, test_flashinfer.py -k replan 4 passed in
1:20 (cold). After the plain path's kernel calls read causality, window and soft-cap from the layer's decisions alone, on a
seventh (transformers 5.17.0): test_transformers_plain.py with test_runtime_on_kernels.py 32 passed in 8:58 (cold), then
test_flashattention.py, test_kernel_facts.py and test_mla_and_local.py 109 passed in 2:39, then test_plan_backend.py and
test_page_ids.py 34 passed in 0:43. With the runs above, every file of tests/gpu passed after this session's changes but
test_two_gpus.py (untouched paths; 5 passed on 2 x H200 in the third session).
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
