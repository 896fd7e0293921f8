"""The FA4 fast launch (attngate.backends.fa4_launch) against flash_attn.cute's public call, bitwise, over a grid: head
dims 64/128/256, GQA ratios 1/4/8, causal, window and full, soft-cap, learned sinks, varlen rows and rows read in place
(seqused_q/k over a padded batch), with and without the LSE, bf16 and fp16 (a covering grid, not the product). Each signature's second call must take the recorded launch
(the pinned flash-attn-4), and every call's output must equal the public call's bit for bit."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
cute = pytest.importorskip("flash_attn.cute")

from attngate.backends import fa4_launch  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16
# each value of each axis at least once, most pairs (FA4 compiles each variant in 2 to 3 s: no full product)
GRID = [
    # head dim, (q heads, kv heads), mask, soft-cap, sinks, layout, dtype
    (64, (8, 8), "causal", 0.0, False, "varlen", BF16),
    (128, (16, 4), "causal", 0.0, False, "in_place", BF16),
    (128, (32, 4), "window", 30.0, False, "in_place", BF16),
    (256, (16, 4), "causal", 30.0, True, "varlen", BF16),
    (128, (8, 8), "full", 0.0, True, "varlen", FP16),
    (64, (32, 4), "window", 0.0, True, "in_place", FP16),
    (256, (8, 8), "window", 0.0, False, "in_place", FP16),
    (128, (16, 4), "full", 30.0, False, "varlen", FP16),
]


def _case(head_dim, heads, mask, softcap, sinks, layout, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    hq, hkv = heads
    lengths = [37, 300, 1, 129]
    if layout == "varlen":
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
        used, total, stride = None, sum(lengths), None
    else:  # a padded batch of 320 slots a request, seqused_q/k of them read from each start
        stride = 320
        cu = torch.arange(0, stride * (len(lengths) + 1), stride, dtype=torch.int32, device="cuda")
        used, total = torch.tensor(lengths, dtype=torch.int32, device="cuda"), stride * len(lengths)
    q, k, v = (torch.randn(total, h, head_dim, generator=g, device="cuda", dtype=dtype) for h in (hq, hkv, hkv))
    kw = dict(
        cu_seqlens_q=cu, cu_seqlens_k=cu, seqused_q=used, seqused_k=used, max_seqlen_q=stride or max(lengths),
        max_seqlen_k=512, softmax_scale=head_dim**-0.5, causal=mask == "causal",
        window_size=(64, 0) if mask == "window" else (None, None),
        learnable_sink=torch.randn(hq, generator=g, device="cuda") if sinks else None, softcap=softcap,
    )  # fmt: skip
    return q, k, v, kw


def _written(kw) -> torch.Tensor:
    """``[total_q]`` bool: the query rows the kernel writes (every row of a varlen batch; a padded batch's first
    seqused_q rows of each request's slots)."""
    cu, used = kw["cu_seqlens_q"], kw["seqused_q"]
    total = int(cu[-1])
    if used is None:
        return torch.ones(total, dtype=torch.bool, device=cu.device)
    j = torch.arange(total, device=cu.device)
    request = torch.searchsorted(cu[1:], j, right=True)
    return (j - cu[request]) < used[request]


@pytest.mark.parametrize("return_lse", [False, True])
def test_the_fast_launch_equals_the_public_call_bitwise(return_lse):
    taken = 0
    for index, params in enumerate(GRID):
        for seed in (index, index + 10_000):  # the first call records, the second replays
            q, k, v, kw = _case(*params, seed)
            got, lse = fa4_launch.flash_attn_varlen(cute, q, k, v, **kw, return_lse=return_lse)
            expected = cute.flash_attn_varlen_func(q, k, v, **kw, return_lse=return_lse)
            expected, expected_lse = expected if isinstance(expected, tuple) else (expected, None)
            rows = _written(kw)  # rows past seqused_q are never written (the interface's out is torch.empty too)
            assert torch.equal(got[rows], expected[rows]), params
            assert (lse is None) == (not return_lse), params
            assert lse is None or torch.equal(lse[:, rows], expected_lse[:, rows]), params
    launches = fa4_launch.launches()
    taken = sum(launches.values())
    # the fast path is no dead branch: most signatures replay (split-KV or scheduler metadata keep the public call)
    assert taken >= len(launches) * 3 // 4, f"{taken} of {len(launches)} signatures launch fast"


@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_a_growing_cache_keeps_its_signature_and_replays_bitwise(dtype):
    """Decode over transformers' DynamicCache: each step's K/V are new [B, H_kv, S, D] tensors, one token longer, read
    in place (a head stride of S * D). Every step after the first replays the recorded launch (one signature, the
    strides' alignment alone in its key) and equals the public call bit for bit."""
    from attngate.backends import fa_padded

    g = torch.Generator(device="cuda").manual_seed(7)
    b, hq, hkv, d = 3, 16, 4, 128
    q = torch.randn(b, hq, d, generator=g, device="cuda", dtype=dtype)
    before = set(fa4_launch.launches())
    for s_kv in range(600, 612):
        cache = [torch.randn(b, hkv, s_kv, d, generator=g, device="cuda", dtype=dtype) for _ in range(2)]
        (k, row), (v, _) = (fa_padded.token_rows(t) for t in cache)
        cu_k = torch.arange(0, b * row + 1, row, dtype=torch.int32, device="cuda")
        kw = dict(
            cu_seqlens_q=torch.arange(b + 1, dtype=torch.int32, device="cuda"), cu_seqlens_k=cu_k, seqused_q=None,
            seqused_k=torch.full((b,), s_kv, dtype=torch.int32, device="cuda"), max_seqlen_q=1, max_seqlen_k=1024,
            softmax_scale=d**-0.5, causal=True, window_size=(None, 0), learnable_sink=None, softcap=0.0,
        )  # fmt: skip
        got, _ = fa4_launch.flash_attn_varlen(cute, q, k, v, **kw)
        expected = cute.flash_attn_varlen_func(q, k, v, **kw)
        expected = expected[0] if isinstance(expected, tuple) else expected
        assert torch.equal(got, expected), s_kv
    launches = fa4_launch.launches()
    new = set(launches) - before
    assert len(new) <= 1 and all(launches[key] for key in new), new  # one signature for the 12 steps, launched fast
