"""Scenario tests of the runtime and the reference backend against an independent dense computation
(torch's scaled_dot_product_attention with an explicit mask)."""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")

from attngate import ForwardMode, LayerKind, ModelFacts, Platform, ServerArgs, resolve  # noqa: E402
from attngate.backends.reference import ReferenceBackend  # noqa: E402
from attngate.backends.runtime.batch_builder import build_batch  # noqa: E402
from attngate.backends.runtime.kv_cache import (  # noqa: E402
    MHATokenToKVPool,
    MLATokenToKVPool,
    PageAllocator,
    ReqToTokenPool,
)
from attngate.backends.runtime.layer import AttentionLayer  # noqa: E402
from attngate.errors import BatchMetadataError, KVCacheExhausted  # noqa: E402
from tests.support.helpers import MODELS  # noqa: E402

H, HKV, D = 8, 2, 16
PLAN = resolve(
    ServerArgs(attention_backend="fa3"),
    ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json"),
    Platform.from_name("sm90"),
).plan


def dense(q, k, v, q_pos, k_pos, *, scaling, causal=True, window=None, chunk=None, softcap=0.0, sinks=None):
    """Independent oracle: SDPA over an explicit boolean mask, sinks as an extra zero-value key."""
    mask = torch.ones(len(q_pos), len(k_pos), dtype=torch.bool)
    if causal:
        mask &= k_pos[None] <= q_pos[:, None]
    if window is not None:
        mask &= k_pos[None] >= q_pos[:, None] - window
    if chunk:
        mask &= (k_pos[None] // chunk) == (q_pos[:, None] // chunk)
    qh, kh, vh = q.double().transpose(0, 1), k.double().transpose(0, 1), v.double().transpose(0, 1)
    kh = kh.repeat_interleave(q.shape[1] // k.shape[1], 0)
    vh = vh.repeat_interleave(q.shape[1] // k.shape[1], 0)
    if softcap or sinks is not None:  # softcap and sinks are outside SDPA: write the softmax out
        s = qh @ kh.transpose(1, 2) * scaling
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~mask, -math.inf)
        if sinks is not None:
            s = torch.cat([s, sinks.double().view(-1, 1, 1).expand(-1, s.shape[1], 1)], -1)
        p = torch.softmax(s, -1)[..., : kh.shape[1]]
        return (p @ vh).transpose(0, 1).float()
    return (
        torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scaling)
        .transpose(0, 1)
        .float()
    )


def setup(requests, mode, page_size, *, layer=None, plan=PLAN, dtype=torch.float32, encoder_lens=None, seed=0):
    layer = layer or AttentionLayer(0, H, HKV, D, D, D**-0.5)
    pool = MHATokenToKVPool(1024, page_size, 1, layer.num_kv_heads, layer.head_dim, layer.v_head_dim, dtype=dtype)
    s = build_batch(
        requests, mode, page_size=page_size, num_slots=1024, max_context_len=256, encoder_lens=encoder_lens, seed=seed
    )
    gen = torch.Generator().manual_seed(seed)
    full_k, full_v = [], []
    for (prefix, new), slots, enc in zip(requests, s.slots, encoder_lens or [0] * len(requests)):
        k = torch.randn(enc + prefix + new, layer.num_kv_heads, layer.head_dim, generator=gen)
        v = torch.randn(enc + prefix + new, layer.num_kv_heads, layer.v_head_dim, generator=gen)
        pool.set_kv_buffer(0, slots[: enc + prefix], k[: enc + prefix], v[: enc + prefix])
        full_k.append(k)
        full_v.append(v)
    backend = ReferenceBackend(plan, pool, s.req_to_token_pool.req_to_token, [layer])
    return s, pool, backend, full_k, full_v, gen


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "mode", [ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2, ForwardMode.DECODE]
)
def test_uneven_batch_matches_dense(page_size, mode):
    lens = [1, page_size - 1 or 2, page_size, page_size + 1, 61]
    if mode == ForwardMode.DECODE:
        requests = [(n, 1) for n in lens]
    elif mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2):
        requests = [(n, 4) for n in lens]  # a fixed number of draft / new tokens per request
    else:
        requests = [(0, lens[0]), (lens[1], lens[2]), (lens[3], 7), (0, lens[4]), (lens[4], lens[3])]
    s, pool, backend, full_k, full_v, gen = setup(requests, mode, page_size)
    q = torch.randn(s.batch.num_tokens, H, D, generator=gen)
    new_k = torch.cat([k[p:] for k, (p, _) in zip(full_k, requests)])
    new_v = torch.cat([v[p:] for v, (p, _) in zip(full_v, requests)])
    backend.init_forward_metadata(s.batch)
    out = backend.forward(q, new_k, new_v, backend.layers[0], s.batch)
    row = 0
    for (prefix, new), k, v in zip(requests, full_k, full_v):
        expected = dense(
            q[row : row + new], k, v, torch.arange(prefix, prefix + new), torch.arange(prefix + new), scaling=D**-0.5
        )
        torch.testing.assert_close(out[row : row + new], expected, atol=1e-5, rtol=1e-5)
        row += new
    # the new tokens' K/V landed at out_cache_loc
    torch.testing.assert_close(pool.k_buffer[0][s.batch.out_cache_loc], new_k)


@pytest.mark.parametrize(
    "kind, kwargs",
    [
        (LayerKind.SLIDING_WINDOW, {"sliding_window_size": 6}),
        (LayerKind.CHUNKED_LOCAL, {"attention_chunk_size": 8}),
        (LayerKind.FULL, {"logit_cap": 5.0}),
        (LayerKind.FULL, {"sinks": torch.linspace(-1, 2, H)}),
        (LayerKind.SLIDING_WINDOW, {"sliding_window_size": 3, "logit_cap": 30.0, "sinks": torch.zeros(H)}),
    ],
)
@pytest.mark.parametrize("page_size", [1, 16])
def test_layer_features_match_dense(kind, kwargs, page_size):
    layer = AttentionLayer(0, H, HKV, D, D, D**-0.5, kind=kind, **kwargs)
    requests = [(20, 5), (0, 13), (33, 1)]
    s, _, backend, full_k, full_v, gen = setup(requests, ForwardMode.EXTEND, page_size, layer=layer)
    q = torch.randn(s.batch.num_tokens, H, D, generator=gen)
    backend.init_forward_metadata(s.batch)
    out = backend.forward(
        q,
        torch.cat([k[p:] for k, (p, _) in zip(full_k, requests)]),
        torch.cat([v[p:] for v, (p, _) in zip(full_v, requests)]),
        layer,
        s.batch,
    )
    row = 0
    window = kwargs.get("sliding_window_size") if kind == LayerKind.SLIDING_WINDOW else None
    for (prefix, new), k, v in zip(requests, full_k, full_v):
        expected = dense(
            q[row : row + new],
            k,
            v,
            torch.arange(prefix, prefix + new),
            torch.arange(prefix + new),
            scaling=D**-0.5,
            window=window,
            chunk=kwargs.get("attention_chunk_size"),
            softcap=kwargs.get("logit_cap", 0.0),
            sinks=kwargs.get("sinks"),
        )
        torch.testing.assert_close(out[row : row + new], expected, atol=1e-5, rtol=1e-5)
        row += new


def test_cross_attention_over_encoder_tokens():
    facts = ModelFacts.from_hf_config(MODELS / "whisper-large-v3-turbo.json")
    plan = resolve(ServerArgs(), facts, Platform.from_name("sm90")).plan
    layer = AttentionLayer(0, H, H, D, D, D**-0.5, kind=LayerKind.CROSS_ATTENTION)
    requests, enc = [(0, 3), (5, 2)], [7, 11]
    s, _, backend, full_k, full_v, gen = setup(
        requests, ForwardMode.EXTEND, 16, layer=layer, plan=plan, encoder_lens=enc
    )
    q = torch.randn(s.batch.num_tokens, H, D, generator=gen)
    backend.init_forward_metadata(s.batch)
    out = backend.forward(q, None, None, layer, s.batch)  # encoder K/V already cached
    row = 0
    for (prefix, new), k, v, e in zip(requests, full_k, full_v, enc):
        expected = dense(
            q[row : row + new], k[:e], v[:e], torch.arange(new), torch.arange(e), scaling=D**-0.5, causal=False
        )
        torch.testing.assert_close(out[row : row + new], expected, atol=1e-5, rtol=1e-5)
        row += new
    # the forward that brings the encoder K/V writes them at encoder_out_cache_loc, then reads them back
    enc_k, enc_v = torch.cat([k[:e] for k, e in zip(full_k, enc)]), torch.cat([v[:e] for v, e in zip(full_v, enc)])
    for buf in backend.kv_pool.get_kv_buffer(0):
        buf.zero_()
    torch.testing.assert_close(backend.forward(q, enc_k, enc_v, layer, s.batch), out)
    torch.testing.assert_close(backend.kv_pool.k_buffer[0][s.batch.encoder_out_cache_loc], enc_k)
    no_slots = dataclasses.replace(s.batch, encoder_out_cache_loc=None)
    with pytest.raises(BatchMetadataError, match="encoder_out_cache_loc: needed to write the encoder K/V"):
        backend.forward(q, enc_k, enc_v, layer, no_slots)


def test_idle_batch():
    s, _, backend, *_ = setup([(3, 1)], ForwardMode.IDLE, 1)
    backend.init_forward_metadata(s.batch)
    out = backend.forward(
        torch.empty(0, H, D), torch.empty(0, HKV, D), torch.empty(0, HKV, D), backend.layers[0], s.batch
    )
    assert out.shape == (0, H, D)


def test_embedding_fast_path_equals_paged_path_and_writes_nothing():
    facts = ModelFacts.from_hf_config(MODELS / "Qwen3-Embedding-8B.json")
    fast = resolve(
        ServerArgs.from_flags(
            "--attention-backend fa3 --is-embedding --chunked-prefill-size -1 --disable-radix-cache".split()
        ),
        facts,
        Platform.from_name("sm90"),
    ).plan
    assert fast.fa.skip_kv_cache
    requests = [(0, 9), (0, 17), (0, 1)]
    s1, pool1, paged, full_k, full_v, gen = setup(requests, ForwardMode.EXTEND, 16)
    s2, pool2, skip, *_ = setup(requests, ForwardMode.EXTEND, 16, plan=fast)
    q = torch.randn(s1.batch.num_tokens, H, D, generator=gen)
    k, v = torch.cat(full_k), torch.cat(full_v)
    for backend, s in ((paged, s1), (skip, s2)):
        backend.init_forward_metadata(s.batch)
    torch.testing.assert_close(
        skip.forward(q, k, v, skip.layers[0], s2.batch), paged.forward(q, k, v, paged.layers[0], s1.batch)
    )
    assert pool2.k_buffer[0].abs().sum() == 0 and pool2.v_buffer[0].abs().sum() == 0


MLA_FLAGS = {  # each shipped way to a form of MLA EXTEND (FlashInfer MLA on an H100)
    "non_absorbed": [],
    "non_absorbed_without_prefix": ["--disable-chunked-prefix-cache"],
    "absorbed": ["--flashinfer-mla-disable-ragged"],
}


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.TARGET_VERIFY])
@pytest.mark.parametrize("form", sorted(MLA_FLAGS))
def test_mla_every_form_equals_decompressed_attention(form, mode):
    """MLA over the latent cache (ckv ++ kpe), in the form the plan names, equals MHA over the decompressed K/V."""
    plan = resolve(
        ServerArgs.from_flags(["--attention-backend", "flashinfer", *MLA_FLAGS[form]]),
        ModelFacts.from_hf_config(MODELS / "DeepSeek-V2-Lite.json"),
        Platform.from_name("sm90"),
    ).plan
    assert (
        plan.mode(ForwardMode.EXTEND).common.mla_form == form
        and plan.mode(ForwardMode.DECODE).common.mla_form == "absorbed"
    )
    gen = torch.Generator().manual_seed(3)
    heads, rank, rope, nope, vdim = 4, 32, 8, 16, 12
    w_kc = torch.randn(heads, nope, rank, generator=gen) / rank**0.5  # latent -> per-head k_nope
    w_vc = torch.randn(heads, rank, vdim, generator=gen) / rank**0.5  # latent -> per-head v
    requests = {
        ForwardMode.EXTEND: [(11, 4), (0, 6), (3, 9)],
        ForwardMode.DECODE: [(11, 1), (0, 1), (20, 1)],
        ForwardMode.TARGET_VERIFY: [(11, 3), (5, 3)],
    }[mode]
    scaling = 0.3
    layer = AttentionLayer(
        0,
        heads,
        1,
        nope + rope,
        vdim,
        scaling,
        is_mla=True,
        kv_lora_rank=rank,
        qk_rope_head_dim=rope,
        w_kc=w_kc,
        w_vc=w_vc,
    )
    pool = MLATokenToKVPool(256, 16, 1, rank, rope, dtype=torch.float32)
    s = build_batch(requests, mode, page_size=16, num_slots=256, max_context_len=64)
    latents = [torch.randn(p + n, 1, rank + rope, generator=gen) for p, n in requests]
    for (p, _), slots, lat in zip(requests, s.slots, latents):
        pool.set_kv_buffer(0, slots[:p], lat[:p])
    q = torch.randn(s.batch.num_tokens, heads, nope + rope, generator=gen)
    backend = ReferenceBackend(plan, pool, s.req_to_token_pool.req_to_token, [layer])
    backend.init_forward_metadata(s.batch)
    out = backend.forward(q, torch.cat([lat[p:] for lat, (p, _) in zip(latents, requests)]), None, layer, s.batch)
    assert out.shape == (s.batch.num_tokens, heads, vdim)
    row = 0
    for (p, n), lat, slots in zip(requests, latents, s.slots):
        torch.testing.assert_close(pool.kv_buffer[0][slots], lat)  # the latent is written in every form
        c, k_rope = lat[:, 0, :rank], lat[:, 0, rank:]
        k = torch.cat([torch.einsum("tr,hnr->thn", c, w_kc), k_rope[:, None].expand(-1, heads, -1)], -1)
        v = torch.einsum("tr,hrv->thv", c, w_vc)
        expected = dense(q[row : row + n], k, v, torch.arange(p, p + n), torch.arange(p + n), scaling=scaling)
        torch.testing.assert_close(out[row : row + n], expected, atol=1e-4, rtol=1e-4)
        row += n


def test_mla_layer_without_weights_is_a_clear_error():
    layer = AttentionLayer(0, 4, 1, 24, 12, 0.3, is_mla=True, kv_lora_rank=32, qk_rope_head_dim=8)
    pool = MLATokenToKVPool(64, 16, 1, 32, 8, dtype=torch.float32)
    s = build_batch([(0, 3)], ForwardMode.EXTEND, page_size=16, num_slots=64, max_context_len=16)
    backend = ReferenceBackend(PLAN, pool, s.req_to_token_pool.req_to_token, [layer])
    backend.init_forward_metadata(s.batch)
    with pytest.raises(BatchMetadataError, match="w_kc and w_vc"):
        backend.forward(torch.zeros(3, 4, 24), torch.zeros(3, 1, 40), None, layer, s.batch)


def test_pool_exhaustion_is_a_clear_error():
    allocator = PageAllocator(4, 16)
    allocator.alloc_pages(3)
    with pytest.raises(KVCacheExhausted, match="need 2 pages of 16 tokens, 1 of 4 free"):
        allocator.alloc_pages(2)
    with pytest.raises(KVCacheExhausted):
        build_batch([(60, 10), (60, 10)], ForwardMode.EXTEND, page_size=16, num_slots=128, max_context_len=128)
    rows = ReqToTokenPool(2, 8)
    first, _ = rows.alloc(), rows.alloc()
    with pytest.raises(KVCacheExhausted, match="req_to_token: all 2 request slots are in use"):
        rows.alloc()
    rows.free(first)
    with pytest.raises(BatchMetadataError, match=f"req_to_token: row {first} is not in use"):
        rows.free(first)  # a row on the free list twice would go to two requests
    assert rows.alloc() == first
    pages = PageAllocator(4, 16)
    held = pages.alloc_pages(2)
    assert held == [0, 1]
    with pytest.raises(BatchMetadataError) as bad:  # nothing freed: every page still handed out once
        pages.free([0, 0, 3])
    assert [str(p) for p in bad.value.problems] == [
        "kv pool: pages [3] are not in use (freed twice, or never allocated)",
        "kv pool: pages [0] are given more than once",
    ]
    pages.free(held)
    assert pages.free_pages == 4


def test_kv_write_takes_a_strided_slice_of_a_fused_qkv():
    """k and v as views into one fused projection output (not contiguous): written as if they were."""
    pool = MHATokenToKVPool(32, 16, 1, HKV, D, dtype=torch.bfloat16)
    qkv = torch.randn(5, (H + 2 * HKV) * D).to(torch.bfloat16)
    k = qkv[:, H * D : (H + HKV) * D].view(5, HKV, D)
    v = qkv[:, (H + HKV) * D :].view(5, HKV, D)
    loc = torch.tensor([3, 17, 0, 31, 8])
    pool.set_kv_buffer(0, loc, k, v)
    assert torch.equal(pool.k_buffer[0][loc], k) and torch.equal(pool.v_buffer[0][loc], v)
    odd = qkv[:, 1 : 1 + HKV * D].view(5, HKV, D)  # starts off an 8-byte boundary: no word view, copied first
    pool.set_kv_buffer(0, loc, odd, odd)
    assert torch.equal(pool.k_buffer[0][loc], odd)


def test_bad_metadata_is_a_clear_error():
    s, _, backend, *_ = setup([(5, 3), (0, 4)], ForwardMode.EXTEND, 16)
    bad = s.batch
    bad.out_cache_loc = bad.out_cache_loc.clone()
    bad.out_cache_loc[2] = 5000
    with pytest.raises(
        BatchMetadataError, match=r"out_cache_loc: slot indices \[5000\] lie outside the pool of 1024 slots"
    ):
        backend.init_forward_metadata(bad)
    s, _, backend, *_ = setup([(5, 1)], ForwardMode.DECODE, 16)
    s.batch.seq_lens = s.batch.seq_lens + 300
    s.batch.extend_prefix_lens = s.batch.extend_prefix_lens + 300
    with pytest.raises(BatchMetadataError, match="exceeds the req_to_token width 256"):
        backend.init_forward_metadata(s.batch)


def test_seq_lens_must_be_post_write_lengths():
    s, _, backend, *_ = setup([(5, 4)], ForwardMode.DRAFT_EXTEND_V2, 16)
    s.batch.seq_lens = s.batch.extend_prefix_lens.clone()  # the prefix-only convention SGLang's tests once used
    with pytest.raises(BatchMetadataError, match="post-write lengths"):
        backend.init_forward_metadata(s.batch)


@pytest.mark.parametrize("dtype,head_dim", [(torch.bfloat16, 16), (torch.float32, 16), (torch.bfloat16, 3)])
def test_set_kv_buffer_writes_exactly_the_given_slots(dtype, head_dim):
    """The pool's row scatter (8-byte words where the layout allows) against plain indexing, for a
    strided source (K/V split from one fused projection), a flattened one of another dtype, int32 slot
    indices and odd row sizes."""
    pool = MHATokenToKVPool(64, 16, 2, HKV, head_dim, dtype=dtype)
    loc = torch.tensor([9, 0, 63, 17, 32], dtype=torch.int32)
    kv = torch.randn(5, 2, HKV, head_dim).to(dtype)
    k, v = kv[:, 0], kv[:, 1]  # non-contiguous views
    pool.set_kv_buffer(1, loc, k, v.flatten(1).float())  # V flattened per token and in another dtype: cast and reshaped
    k_buf, v_buf = pool.get_kv_buffer(1)
    expected_k, expected_v = torch.zeros_like(k_buf), torch.zeros_like(v_buf)
    expected_k[loc.long()], expected_v[loc.long()] = k, v
    assert torch.equal(k_buf, expected_k) and torch.equal(v_buf, expected_v)
    assert not pool.get_kv_buffer(0)[0].any()  # other layers untouched
    mla = MLATokenToKVPool(64, 16, 1, kv_lora_rank=8, qk_rope_head_dim=4, dtype=dtype)
    latent = torch.randn(5, 1, 12).to(dtype)
    mla.set_kv_buffer(0, loc, latent)
    assert (
        torch.equal(mla.get_kv_buffer(0)[0][loc.long()], latent)
        and int((mla.get_kv_buffer(0)[0] != 0).any(-1).sum()) == 5
    )


@pytest.mark.parametrize("page_size", [1, 16])
def test_tree_verify_sees_the_prefix_and_each_tokens_ancestors(page_size):
    """EAGLE tree verify (topk > 1): draft token i attends to the cached prefix and to its ancestors in the tree and
    itself, each computed here from an explicit parent list, not from the mask the backend reads."""
    tree_plan = resolve(
        ServerArgs(
            attention_backend="flashinfer",
            speculative_algorithm="EAGLE",
            speculative_eagle_topk=4,
            speculative_num_steps=5,
            speculative_num_draft_tokens=8,
        ),
        ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json"),
        Platform.from_name("sm90"),
    ).plan
    parents = [[-1, 0, 0, 1, 1, 2, 3, 0], [-1, 0, 1, 2, 3, 4, 5, 6]]  # a bushy tree; a chain
    requests = [(19, 8), (40, 8)]
    s, _, backend, full_k, full_v, gen = setup(requests, ForwardMode.TARGET_VERIFY, page_size, plan=tree_plan)
    ancestors = [[_ancestors(p, i) for i in range(8)] for p in parents]
    s.batch.spec_tree_mask = torch.tensor([[[j in anc[i] for j in range(8)] for i in range(8)] for anc in ancestors])
    q = torch.randn(s.batch.num_tokens, H, D, generator=gen)
    backend.init_forward_metadata(s.batch)
    out = backend.forward(
        q,
        torch.cat([k[p:] for k, (p, _) in zip(full_k, requests)]),
        torch.cat([v[p:] for v, (p, _) in zip(full_v, requests)]),
        backend.layers[0],
        s.batch,
    )
    for r, ((prefix, _), k, v) in enumerate(zip(requests, full_k, full_v)):
        for i in range(8):
            keys = torch.tensor(list(range(prefix)) + [prefix + j for j in sorted(ancestors[r][i])])
            expected = dense(
                q[8 * r + i : 8 * r + i + 1],
                k[keys],
                v[keys],
                torch.tensor([0]),
                torch.arange(len(keys)),
                scaling=D**-0.5,
                causal=False,
            )
            torch.testing.assert_close(out[8 * r + i : 8 * r + i + 1], expected, atol=1e-5, rtol=1e-5)


def _ancestors(parents: list[int], i: int) -> set[int]:
    seen = {i}
    while parents[i] >= 0:
        i = parents[i]
        seen.add(i)
    return seen
