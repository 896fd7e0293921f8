"""The FA3 provider (``flash_attn_interface``) adapter on the CPU, against the reference backend.

No FA3 build exists for the CI machine or the lent GPU host, so a stand-in module with FA3's
signatures (hopper/flash_attn_interface.py: the parameter names and positions the adapter uses) and
FA3's documented semantics (bottom-right causal alignment, ``window_size`` (left, right) with -1 for
none, softcap, paged K/V through ``page_table`` and ``cache_seqlens``) checks the wiring: which
arguments reach the kernel, and that the scheduler-metadata precompute follows the plan and is
planned with the geometry of the call that uses it.
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from attngate import ForwardMode, LayerKind, ModelFacts, Platform, ServerArgs, resolve  # noqa: E402
from attngate.backends.flashattention import FlashAttentionBackend  # noqa: E402
from attngate.backends.reference import ReferenceBackend  # noqa: E402
from attngate.backends.runtime.batch_builder import build_batch  # noqa: E402
from attngate.backends.runtime.kv_cache import MHATokenToKVPool  # noqa: E402
from attngate.backends.runtime.layer import AttentionLayer  # noqa: E402
from tests.support.backend_cases import (  # noqa: E402
    assert_mla_matches_reference,
    assert_mla_replays_match_reference,
    mla_cpu_batch,
    mla_cpu_layer,
)
from tests.support.helpers import MODELS  # noqa: E402
from tests.support.standins.graphs import RECORDER  # noqa: E402
from tests.support.standins.kernel_math import attend, request_mask  # noqa: E402

H, HKV, D = 8, 2, 16
REQUESTS = [(0, 5), (17, 3), (40, 1), (3, 9)]


def _dense(q, k, v, *, causal, window, softcap, scale, qv=None):
    """One request through the stand-ins' attention math (bottom-right alignment; window -1: none)."""
    mask = request_mask(q.shape[0], k.shape[0], causal=causal, window_left=window[0], window_right=window[1])
    return attend(q, k, v, mask, scale=scale, out_dtype=q.dtype, softcap=softcap, qv=qv)[0]


class FakeFa3(types.ModuleType):
    """``flash_attn_interface`` stand-in; records every call."""

    def __init__(self) -> None:
        super().__init__("flash_attn_interface")
        self.calls: list[tuple[str, dict]] = []

    def get_scheduler_metadata(
        self,
        batch_size,
        max_seqlen_q,
        max_seqlen_k,
        num_heads_q,
        num_heads_kv,
        headdim,
        cache_seqlens,
        qkv_dtype=torch.bfloat16,
        headdim_v=None,
        cu_seqlens_q=None,
        cu_seqlens_k_new=None,
        cache_leftpad=None,
        page_size=None,
        max_seqlen_k_new=0,
        causal=False,
        window_size=(-1, -1),
        attention_chunk=0,
        has_softcap=False,
        num_splits=0,
        pack_gqa=None,
        sm_margin=0,
    ):
        self.calls.append(("get_scheduler_metadata", dict(locals())))
        return torch.tensor([len(self.calls)], dtype=torch.int32)  # a token the kernel call must receive

    def flash_attn_with_kvcache(
        self,
        q,
        k_cache,
        v_cache,
        k=None,
        v=None,
        qv=None,
        rotary_cos=None,
        rotary_sin=None,
        cache_seqlens=None,
        cache_batch_idx=None,
        cache_leftpad=None,
        page_table=None,
        cu_seqlens_q=None,
        cu_seqlens_k_new=None,
        max_seqlen_q=None,
        rotary_seqlens=None,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        attention_chunk=0,
        softcap=0.0,
        rotary_interleaved=True,
        scheduler_metadata=None,
        num_splits=0,
        pack_gqa=None,
        sm_margin=0,
        return_softmax_lse=False,
    ):
        self.calls.append(("flash_attn_with_kvcache", dict(locals())))
        RECORDER.launch(
            "flash_attn_with_kvcache",
            cache_seqlens=cache_seqlens,
            page_table=page_table,
            cu_seqlens_q=cu_seqlens_q,
            max_seqlen_q=max_seqlen_q,
            scheduler_metadata=scheduler_metadata,
            num_splits=num_splits,
        )
        assert k is None and v is None, "the backend writes the cache itself"
        page_size = k_cache.shape[1]
        out = []
        for b in range(cache_seqlens.shape[0]):
            n = int(cache_seqlens[b])
            pages = page_table[b, : -(-n // page_size)].long()
            kb, vb = k_cache[pages].flatten(0, 1)[:n], v_cache[pages].flatten(0, 1)[:n]
            rows = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
            out.append(
                _dense(
                    q[rows],
                    kb,
                    vb,
                    causal=causal,
                    window=window_size,
                    softcap=softcap,
                    scale=softmax_scale,
                    qv=None if qv is None else qv[rows],
                )
            )
        return torch.cat(out)

    def flash_attn_varlen_func(
        self,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        seqused_q=None,
        seqused_k=None,
        softmax_scale=None,
        causal=False,
        qv=None,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        window_size=(-1, -1),
        attention_chunk=0,
        softcap=0.0,
        num_splits=1,
        pack_gqa=None,
        deterministic=False,
        sm_margin=0,
        return_attn_probs=False,
    ):
        self.calls.append(("flash_attn_varlen_func", dict(locals())))
        return torch.cat(
            [
                _dense(
                    q[int(cu_seqlens_q[b]) : int(cu_seqlens_q[b + 1])],
                    k[int(cu_seqlens_k[b]) : int(cu_seqlens_k[b + 1])],
                    v[int(cu_seqlens_k[b]) : int(cu_seqlens_k[b + 1])],
                    causal=causal,
                    window=window_size,
                    softcap=softcap,
                    scale=softmax_scale,
                )
                for b in range(cu_seqlens_q.shape[0] - 1)
            ]
        )


@pytest.fixture
def fa3(monkeypatch) -> FakeFa3:
    fake = FakeFa3()
    monkeypatch.setitem(__import__("sys").modules, "flash_attn_interface", fake)
    return fake


def _plan(model: str = "Llama-3.1-8B", page_size: int = 1, **args):
    facts = ModelFacts.from_hf_config(MODELS / f"{model}.json")
    plan = resolve(
        ServerArgs(attention_backend="fa3", page_size=page_size, **args),
        facts,
        Platform.from_name("sm90", has_flash_attn_interface=True),
    ).plan
    assert plan.fa.provider == "flash_attn_interface"
    return plan


def _run(plan, mode: ForwardMode, layer: AttentionLayer, page_size: int, requests=REQUESTS):
    """(FA3-adapter output, reference output) for one batch whose prefixes are already cached."""
    s = build_batch(requests, mode, page_size=page_size, num_slots=1024, max_context_len=256, seed=1)
    gen = torch.Generator().manual_seed(2)
    pools = [MHATokenToKVPool(1024, page_size, 1, HKV, D, dtype=torch.float32) for _ in range(2)]
    for (prefix, _), slots in zip(requests, s.slots):
        k, v = torch.randn(prefix, HKV, D, generator=gen), torch.randn(prefix, HKV, D, generator=gen)
        for pool in pools:
            pool.set_kv_buffer(0, slots[:prefix], k, v)
    n = s.batch.num_tokens
    q, k, v = (torch.randn(n, h, D, generator=gen) for h in (H, HKV, HKV))
    outs = []
    for cls, pool in ((FlashAttentionBackend, pools[0]), (ReferenceBackend, pools[1])):
        backend = cls(plan, pool, s.req_to_token_pool.req_to_token, [layer], "cpu")
        backend.init_forward_metadata(s.batch)
        outs.append(backend.forward(q, k, v, layer, s.batch))
    return outs


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "mode", [ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2]
)
@pytest.mark.parametrize("kind", [LayerKind.FULL, LayerKind.SLIDING_WINDOW])
def test_fa3_adapter_equals_the_reference(fa3, kind, mode, page_size):
    window = 6 if kind == LayerKind.SLIDING_WINDOW else None
    layer = AttentionLayer(0, H, HKV, D, D, D**-0.5, kind=kind, sliding_window_size=window, logit_cap=30.0)
    requests = [(p, 1) for p, _ in REQUESTS] if mode == ForwardMode.DECODE else REQUESTS
    out, ref = _run(_plan(page_size=page_size), mode, layer, page_size, requests)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    ((name, call),) = [c for c in fa3.calls if c[0] != "get_scheduler_metadata"]
    assert name == "flash_attn_with_kvcache" and call["softcap"] == 30.0
    assert call["window_size"] == ((window, 0) if window else (-1, -1))


def test_fa3_scheduler_metadata_follows_the_plan(fa3):
    layer = AttentionLayer(0, H, HKV, D, D, D**-0.5, kind=LayerKind.FULL)
    decode = [(p, 1) for p, _ in REQUESTS]
    _run(_plan(page_size=16), ForwardMode.DECODE, layer, 16, decode)
    (_, meta), (_, call) = fa3.calls
    assert call["scheduler_metadata"] is not None and int(call["scheduler_metadata"]) == 1
    assert meta["cache_seqlens"] is call["cache_seqlens"] and meta["cu_seqlens_q"] is call["cu_seqlens_q"]
    assert (meta["page_size"], meta["num_splits"], meta["causal"], meta["has_softcap"]) == (
        16,
        call["num_splits"],
        call["causal"],
        False,
    )
    assert (meta["batch_size"], meta["max_seqlen_q"], meta["max_seqlen_k"]) == (4, 1, max(p + 1 for p, _ in decode))
    assert (meta["num_heads_q"], meta["num_heads_kv"], meta["headdim"], meta["headdim_v"]) == (H, HKV, D, D)
    fa3.calls.clear()  # DP attention: never precomputed (the stale-schedule out-of-bounds read of SGLang PR 21104)
    _run(_plan(page_size=16, enable_dp_attention=True, dp_size=2, tp_size=2), ForwardMode.DECODE, layer, 16, decode)
    assert [name for name, _ in fa3.calls] == ["flash_attn_with_kvcache"] and fa3.calls[0][1][
        "scheduler_metadata"
    ] is None
    fa3.calls.clear()  # extend batches take no decode schedule
    _run(_plan(page_size=16), ForwardMode.EXTEND, layer, 16)
    assert [name for name, _ in fa3.calls] == ["flash_attn_with_kvcache"]


def test_fa3_encoder_only_layers_attend_on_the_raw_kv(fa3):
    layer = AttentionLayer(0, H, HKV, D, D, D**-0.5, kind=LayerKind.ENCODER_ONLY)
    out, ref = _run(_plan(), ForwardMode.EXTEND, layer, 1, [(0, n) for _, n in REQUESTS])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    ((name, call),) = fa3.calls
    assert name == "flash_attn_varlen_func" and call["causal"] is False


# ---- chunked-local and MLA layers through the FA3 adapter ---------------------------------------


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.TARGET_VERIFY])
def test_fa3_chunked_local_layers_run_as_local_virtual_batches(fa3, mode, page_size):
    chunk = 16
    layer = AttentionLayer(0, H, HKV, D, D, D**-0.5, kind=LayerKind.CHUNKED_LOCAL, attention_chunk_size=chunk)
    requests = [(p, 1) for p, _ in REQUESTS] if mode == ForwardMode.DECODE else REQUESTS + [(14, 37)]
    out, ref = _run(_plan("Llama-4-Scout-17B-16E-Instruct", page_size), mode, layer, page_size, requests)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    ((name, call),) = fa3.calls
    # one entry per piece of a request inside one chunk: (14, 37) covers positions 14..50, four pieces
    pieces = sum(len(range(p // chunk, (p + n - 1) // chunk + 1)) for p, n in requests)
    assert name == "flash_attn_with_kvcache" and call["cache_seqlens"].shape[0] == pieces
    assert int(call["cache_seqlens"].max()) <= chunk and call["causal"] is True


RANK, ROPE, NOPE, VDIM = 32, 8, 16, 12


def _mla_layer(gen: torch.Generator) -> AttentionLayer:
    return mla_cpu_layer(gen, heads=H, nope=NOPE, rank=RANK, rope=ROPE, v_head_dim=VDIM)


def _mla_batch(requests, mode: ForwardMode, page_size: int, gen: torch.Generator, seed: int = 1):
    return mla_cpu_batch(
        requests, mode, page_size, gen, heads=H, nope=NOPE, rank=RANK, rope=ROPE, seed=seed, num_slots=1024
    )


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "mode, flags, kernel",
    [
        (ForwardMode.EXTEND, {}, "flash_attn_varlen_func"),  # non-absorbed, the prefix decompressed
        (ForwardMode.EXTEND, {"disable_chunked_prefix_cache": True}, "flash_attn_with_kvcache"),  # a prefix: absorbed
        (ForwardMode.DECODE, {}, "flash_attn_with_kvcache"),  # absorbed: q_rope vs kpe, qv vs ckv
        (ForwardMode.TARGET_VERIFY, {}, "flash_attn_with_kvcache"),
    ],
)
def test_fa3_mla_in_the_form_the_plan_names(fa3, mode, flags, kernel, page_size):
    plan = _plan("DeepSeek-V2-Lite", page_size, **flags)
    gen = torch.Generator().manual_seed(5)
    layer = _mla_layer(gen)
    requests = [(p, 1) for p, _ in REQUESTS] if mode == ForwardMode.DECODE else REQUESTS
    assert_mla_matches_reference(FlashAttentionBackend, plan, layer, _mla_batch(requests, mode, page_size, gen))
    assert [name for name, _ in fa3.calls] == [kernel]
    call = fa3.calls[0][1]
    if kernel == "flash_attn_with_kvcache":
        assert call["qv"].shape[-1] == RANK and call["q"].shape[-1] == ROPE and call["v_cache"].shape[-1] == RANK
    else:
        assert call["cu_seqlens_k"][-1] == sum(p + n for p, n in requests)  # prefix and new, decompressed


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY])
def test_fa3_mla_cuda_graph_replay_follows_each_round(fa3, mode):
    """Absorbed MLA decode graphs (emulated, standins.graphs): each replay's lengths and rows (a new tensor, the
    requests in other rows) reach the static page table and lengths the captured kernel reads."""
    plan = _plan("DeepSeek-V2-Lite", 16)
    assert plan.mode(mode).common.capture_cuda_graph
    gen = torch.Generator().manual_seed(5)
    assert_mla_replays_match_reference(
        FlashAttentionBackend,
        plan,
        _mla_layer(gen),
        mode,
        lambda requests, m, seed: _mla_batch(requests, m, 16, gen, seed),
    )
