"""The CPU stand-ins (tests/support/standins) against the real kernels, on the same cases: outputs agree, and
an argument the real kernel rejects is rejected by the stand-in too. Keeps the CPU suite honest."""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("flashinfer")
pytest.importorskip("flash_attn.cute")

from attngate import ForwardMode, LayerKind  # noqa: E402
from attngate.backends.flashattention import FlashAttentionBackend  # noqa: E402
from attngate.backends.flashinfer import FlashInferBackend  # noqa: E402
from tests.support.backend_cases import (  # noqa: E402
    GPU,
    MODE_OF,
    layer_of,
    make_case,
    max_diff,
    plan_for,
    requests_around_page,
    run,
)
from tests.support.standins import flash_attn_cute, flashinfer  # noqa: E402

NAMES = ("flashinfer", "flash_attn", "flash_attn.cute", "flash_attn.cute.interface")
KINDS = {
    LayerKind.FULL: ("Llama-3.1-8B", {}),
    LayerKind.SLIDING_WINDOW: ("Mistral-7B-v0.1", {"sliding_window_size": 100}),
}


@contextmanager
def standins():
    saved = {name: sys.modules.get(name) for name in NAMES}
    sys.modules.update({"flashinfer": flashinfer.module(), **flash_attn_cute.modules()})
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def both(make_backend, plan, shape_requests, mode, page_size, layer, **case_kw):
    """(real kernel output, stand-in output) of one batch, each on its own copy of the case."""
    outs = []
    for use_standin in (False, True):
        case = make_case(GPU, shape_requests, mode, page_size, **case_kw)
        with standins() if use_standin else _nothing():
            outs.append(
                run(
                    make_backend(plan, case, layer),
                    case,
                    layer,
                    **({"k": None, "v": None} if case.encoder_k is not None else {}),
                )
            )
    return outs


@contextmanager
def _nothing():
    yield


def fi(plan, case, layer):
    return FlashInferBackend(plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], "cuda")


def fa(plan, case, layer):
    return FlashAttentionBackend(plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], "cuda")


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", sorted(KINDS, key=lambda k: k.value))
@pytest.mark.parametrize("shape", sorted(MODE_OF))
def test_flashinfer_standin_agrees_with_flashinfer(shape, kind, page_size):
    model, kw = KINDS[kind]
    plan = plan_for(GPU, "flashinfer", page_size, model)
    real, stand_in = both(
        fi, plan, requests_around_page(16)[shape], MODE_OF[shape], page_size, layer_of(GPU, kind, **kw)
    )
    assert max_diff(real, stand_in) < GPU.tol


@pytest.mark.parametrize("page_size", [1, 128])
@pytest.mark.parametrize("kind", sorted(KINDS, key=lambda k: k.value))
@pytest.mark.parametrize("shape", sorted(MODE_OF))
def test_flash_attn_cute_standin_agrees_with_flash_attn_cute(shape, kind, page_size):
    plan = plan_for(GPU, "fa4", page_size)
    sinks = torch.linspace(-1, 1, GPU.heads[0], device="cuda") if kind == LayerKind.SLIDING_WINDOW else None
    layer = layer_of(GPU, kind, sliding_window_size=64 if sinks is not None else -1, logit_cap=30.0, sinks=sinks)
    real, stand_in = both(fa, plan, requests_around_page(128)[shape], MODE_OF[shape], page_size, layer)
    assert max_diff(real, stand_in) < GPU.tol


def test_flashinfer_cross_attention_and_softcap_agree():
    plan = plan_for(GPU, "flashinfer", 16, "whisper-large-v3-turbo")
    real, stand_in = both(
        fi,
        plan,
        [(4, 1), (0, 1), (9, 1)],
        ForwardMode.DECODE,
        16,
        layer_of(GPU, LayerKind.CROSS_ATTENTION),
        encoder_lens=[32, 64, 16],
    )
    assert max_diff(real, stand_in) < GPU.tol
    plan = plan_for(GPU, "flashinfer", 16, "gemma-2-9b")
    layer = layer_of(GPU, LayerKind.SLIDING_WINDOW, sliding_window_size=64, logit_cap=30.0)
    real, stand_in = both(fi, plan, requests_around_page(16)["extend_prefix"], ForwardMode.EXTEND, 16, layer)
    assert max_diff(real, stand_in) < GPU.tol


def test_flashinfer_lse_is_base_2_in_both():
    import flashinfer as real_fi

    h, hkv, d = GPU.heads
    qo = torch.tensor([0, 5, 12], dtype=torch.int32)
    q = torch.randn(12, h, d, device="cuda", dtype=GPU.dtype)
    k, v = (torch.randn(12, hkv, d, device="cuda", dtype=GPU.dtype) for _ in range(2))
    lses = []
    for module in (real_fi, flashinfer.module()):
        wrapper = module.BatchPrefillWithRaggedKVCacheWrapper(
            torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD", backend="fa2"
        )
        wrapper.plan(qo, qo, h, hkv, d, causal=True, q_data_type=GPU.dtype, kv_data_type=GPU.dtype)
        lses.append(wrapper.run(q, k, v, return_lse=True)[1])
    assert (lses[0] - lses[1]).abs().max().item() < 2e-2 * math.log2(math.e)


@pytest.mark.parametrize("replan", ["plan", "fast_decode_plan"])
@pytest.mark.parametrize("bad", ["graph_batch_size_changes", "graph_indices_overflow"])
def test_both_reject_what_flashinfer_rejects(bad, replan):
    """CUDA-graph re-plans, by plan() or fast_decode_plan, that do not fit the captured buffers. (The stand-in is stricter than FlashInfer
    where FlashInfer computes silently: e.g. 32 query heads over 17 KV heads, measured accepted by
    FlashInfer 0.7.2's decode wrapper, is a ValueError in the stand-in.)"""
    import flashinfer as real_fi

    h, hkv, d = GPU.heads
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    for module in (real_fi, flashinfer.module()):
        buffers = dict(
            paged_kv_indptr_buffer=torch.zeros(3, dtype=torch.int32, device="cuda"),
            paged_kv_indices_buffer=torch.zeros(4, dtype=torch.int32, device="cuda"),
            paged_kv_last_page_len_buffer=torch.zeros(2, dtype=torch.int32, device="cuda"),
        )
        wrapper = module.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD", use_cuda_graph=True, **buffers
        )
        kw = dict(q_data_type=GPU.dtype, kv_data_type=GPU.dtype)
        wrapper.plan(i32([0, 1, 2]), i32([0, 1]), i32([1, 1]), h, hkv, d, 1, **kw)
        replan_with = wrapper.plan if replan == "plan" else lambda *a, **k: module.fast_decode_plan(wrapper, *a, **k)
        with pytest.raises(Exception):  # noqa: B017 - FlashInfer raises its own error types
            if bad == "graph_batch_size_changes":
                replan_with(i32([0, 1, 2, 3]), i32([0, 1, 2]), i32([1, 1, 1]), h, hkv, d, 1, **kw)
            else:
                replan_with(i32([0, 3, 6]), i32(list(range(6))), i32([1, 1]), h, hkv, d, 1, **kw)


def test_fa3_paged_state_over_no_keys_is_undefined_as_the_standin_models():
    """FlashInfer 0.7.2's fa3 paged kernel returns a finite lse and a nonzero output for a request with
    no keys (fa2: lse -inf, output 0). The backend merges only rows that have a prefix, and the
    stand-in returns NaN there; if FlashInfer fixes it, this test says so."""
    import flashinfer as real_fi

    h, hkv, d = GPU.heads
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    cache = torch.randn(16, 1, hkv, d, device="cuda", dtype=GPU.dtype)
    q = torch.randn(8, h, d, device="cuda", dtype=GPU.dtype)
    lse = {}
    for family in ("fa2", "fa3"):
        w = real_fi.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD", backend=family
        )
        w.plan(
            i32([0, 3, 8]),
            i32([0, 0, 5]),
            torch.arange(5, dtype=torch.int32, device="cuda"),
            i32([1, 1]),
            h,
            hkv,
            d,
            1,
            causal=False,
            q_data_type=GPU.dtype,
            kv_data_type=GPU.dtype,
        )
        lse[family] = w.run(q, (cache, cache), return_lse=True)[1][:3]
    assert bool(torch.isinf(lse["fa2"]).all()) and bool(torch.isfinite(lse["fa3"]).all())
