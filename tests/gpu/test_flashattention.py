"""The FlashAttention backend against the reference backend on the GPU (bf16, GQA 32/8, head_dim 128)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("flash_attn.cute")

from attngate import ForwardMode, LayerKind  # noqa: E402
from attngate.backends.errors import BatchMetadataError  # noqa: E402
from attngate.backends.flashattention import FlashAttentionBackend  # noqa: E402
from cases import (  # noqa: E402
    D, DTYPE, H, MODE_OF, TOL, layer_of, make_case, plan_for, reference_out, replay_rounds, requests_around_page, run,
    target_in_batch,
)

PAGE_SIZES = [1, 128]
M = ForwardMode
REQUESTS = requests_around_page(PAGE_SIZES[-1])


def fa_backend(plan, case, layer, **kw) -> FlashAttentionBackend:
    return FlashAttentionBackend(plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], "cuda", **kw)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("kind", [LayerKind.FULL, LayerKind.SLIDING_WINDOW])
@pytest.mark.parametrize("shape", sorted(REQUESTS))
def test_modes_and_layer_kinds_match_reference(shape, kind, page_size):
    plan = plan_for(page_size=page_size)
    layer = layer_of(kind, sliding_window_size=100 if kind == LayerKind.SLIDING_WINDOW else -1)
    case = make_case(REQUESTS[shape], MODE_OF[shape], page_size)
    expected = reference_out(case, plan, layer)
    got = run(fa_backend(plan, case, layer), case, layer)
    assert (got.float() - expected.float()).abs().max().item() < TOL
    # the write side stored the new tokens where the reference did
    assert torch.equal(case.pools[0].k_buffer[0][case.setup.batch.out_cache_loc], case.pools[1].k_buffer[0][case.setup.batch.out_cache_loc])


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_softcap_and_sinks_match_reference(page_size):
    plan = plan_for(page_size=page_size)
    layer = layer_of(LayerKind.SLIDING_WINDOW, sliding_window_size=64, logit_cap=30.0,
                     sinks=torch.linspace(-1, 1, H, device="cuda", dtype=torch.float32))
    case = make_case(REQUESTS["extend_prefix"], M.EXTEND, page_size)
    expected = reference_out(case, plan, layer)
    assert (run(fa_backend(plan, case, layer), case, layer).float() - expected.float()).abs().max().item() < TOL


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("mode", [M.EXTEND, M.DECODE])
def test_cross_attention_matches_reference(mode, page_size):
    plan = plan_for(page_size=page_size)
    layer = layer_of(LayerKind.CROSS_ATTENTION)
    enc = [128, 256, 128] if page_size > 1 else [37, 100, 1]
    requests = [(0, 5), (3, 1), (10, 7)] if mode == M.EXTEND else [(4, 1), (0, 1), (9, 1)]
    case = make_case(requests, mode, page_size, encoder_lens=enc)
    from attngate.backends.reference import ReferenceBackend

    ref = ReferenceBackend(plan, case.pools[1], case.setup.req_to_token_pool.req_to_token, [layer], "cuda")
    ref.init_forward_metadata(case.setup.batch)
    expected = ref.forward(case.q, None, None, layer, case.setup.batch)
    fa = fa_backend(plan, case, layer)
    fa.init_forward_metadata(case.setup.batch)
    got = fa.forward(case.q, None, None, layer, case.setup.batch)
    assert (got.float() - expected.float()).abs().max().item() < TOL


def test_encoder_only_matches_reference_and_writes_nothing():
    plan = plan_for(page_size=1)
    layer = layer_of(LayerKind.ENCODER_ONLY)
    case = make_case(REQUESTS["extend"], M.EXTEND, 1)
    expected = reference_out(case, plan, layer)
    got = run(fa_backend(plan, case, layer), case, layer)
    assert (got.float() - expected.float()).abs().max().item() < TOL
    assert not torch.any(case.pools[0].k_buffer[0][case.setup.batch.out_cache_loc])


def test_idle_batch():
    plan = plan_for()
    layer = layer_of(LayerKind.FULL)
    case = make_case([(3, 1)], M.IDLE, 1)
    fa = fa_backend(plan, case, layer)
    fa.init_forward_metadata(case.setup.batch)
    out = fa.forward(torch.empty(0, H, D, device="cuda", dtype=DTYPE), None, None, layer, case.setup.batch)
    assert out.shape == (0, H, D)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_embedding_fast_path_equals_paged_path_and_reference(page_size):
    fast = plan_for(page_size=page_size, is_embedding=True, chunked_prefill_size=-1, disable_radix_cache=True)
    paged = plan_for(page_size=page_size)
    assert fast.flashattention.skip_kv_cache and not paged.flashattention.skip_kv_cache
    layer = layer_of(LayerKind.FULL)
    case = make_case(REQUESTS["extend"], M.EXTEND, page_size)
    before = case.pools[0].k_buffer[0].clone()
    got_fast = run(fa_backend(fast, case, layer), case, layer)
    assert torch.equal(case.pools[0].k_buffer[0], before)  # nothing written
    got_paged = run(fa_backend(paged, case, layer), case, layer)
    expected = reference_out(case, paged, layer)
    assert (got_fast.float() - got_paged.float()).abs().max().item() < TOL
    assert (got_fast.float() - expected.float()).abs().max().item() < TOL


@pytest.mark.parametrize("mode", [M.DRAFT_EXTEND_V2, M.TARGET_VERIFY, M.DECODE])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_cuda_graph_replay_equals_eager_and_reference(mode, page_size):
    plan = plan_for(page_size=page_size, speculative_algorithm="EAGLE", speculative_eagle_topk=1,
                    speculative_num_steps=3, speculative_num_draft_tokens=4)
    assert plan.mode(mode).common.capture_cuda_graph and plan.mode(mode).flashattention.kv_extent == "prefix_plus_new"
    layer = layer_of(LayerKind.FULL)
    for i, case, replayed in replay_rounds(fa_backend, plan, layer, mode, page_size):
        expected = reference_out(case, plan, layer)
        eager_out = run(fa_backend(plan, case, layer), case, layer)
        assert (replayed.float() - expected.float()).abs().max().item() < TOL, f"round {i}"
        assert torch.equal(replayed, eager_out), f"round {i}: replay differs from eager"


@pytest.mark.parametrize("mode", [M.DECODE, M.EXTEND])
def test_deterministic_batch_invariance(mode):
    plan = plan_for(page_size=1, enable_deterministic_inference=True)
    assert plan.flashattention.num_splits == 1
    layer = layer_of(LayerKind.FULL)
    target = (1500, 1) if mode == M.DECODE else (700, 40)
    outs = [target_in_batch(fa_backend, plan, layer, mode, others, target, max_prefix=3000, max_new=80, num_slots=1 << 18)
            for others in (0, 7, 63)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_checked_mode_catches_out_of_range_page():
    plan = plan_for(page_size=128)
    layer = layer_of(LayerKind.FULL)
    case = make_case(REQUESTS["decode"], M.DECODE, 128)
    row = int(case.setup.batch.req_pool_indices[2])
    case.setup.req_to_token_pool.req_to_token[row, 0] = 10 ** 8  # a planted slot far outside the pool
    with pytest.raises(BatchMetadataError, match="outside the pool"):
        fa_backend(plan, case, layer, checked=True).init_forward_metadata(case.setup.batch)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_scheduler_metadata_precompute_follows_the_plan(page_size):
    on = plan_for(page_size=page_size)
    off = plan_for(page_size=page_size, enable_dp_attention=True, dp_size=2)
    assert on.flashattention.precompute_scheduler_metadata and not off.flashattention.precompute_scheduler_metadata
    layer = layer_of(LayerKind.FULL)
    outs = []
    for plan in (on, off):
        case = make_case(REQUESTS["decode"], M.DECODE, page_size)
        fa = fa_backend(plan, case, layer)
        outs.append(run(fa, case, layer))
        assert (fa.md.scheduler_metadata is not None) is plan.flashattention.precompute_scheduler_metadata
    expected = reference_out(make_case(REQUESTS["decode"], M.DECODE, page_size), on, layer)
    for out in outs:
        assert (out.float() - expected.float()).abs().max().item() < TOL
