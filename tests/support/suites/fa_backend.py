"""The FlashAttention backend (flash_attn.cute) against the reference backend (bf16, GQA, page sizes 1 and 128)."""

from __future__ import annotations

import functools

import pytest
import torch

from attngate import ForwardMode, LayerKind, ModelFacts, Platform, ServerArgs, resolve
from attngate.backends.factories import backend_factory
from attngate.backends.flashattention import FlashAttentionBackend
from attngate.errors import BackendRefusal, BatchMetadataError
from tests.support.backend_cases import (
    ENCODER_PAGES,
    MODE_OF,
    SPECULATIVE,
    SPECULATIVE_TREE,
    Env,
    assert_replays_match_reference,
    layer_of,
    make_case,
    max_diff,
    plan_for,
    random_tree,
    reference_out,
    rel_err,
    replay_rounds,
    requests_around_page,
    run,
    target_in_batch,
    with_cross_layer,
)
from tests.support.helpers import MODELS

PAGE_SIZES = [1, 128]
M = ForwardMode
REQUESTS = requests_around_page(PAGE_SIZES[-1])


def fa_backend(env: Env, plan, case, layer, **kw) -> FlashAttentionBackend:
    return FlashAttentionBackend(
        plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], env.device, **kw
    )


# ---- chunked local attention (Llama 4: GQA, a 256-token chunk that requests straddle) ---------------

CHUNK = 256


def local_requests(page_size: int) -> dict[str, list[tuple[int, int]]]:
    out = requests_around_page(page_size)
    out["extend_prefix"] = out["extend_prefix"] + [(CHUNK - 3, 10), (CHUNK, 600)]  # across one and several chunk ends
    out["decode"] = out["decode"] + [(CHUNK - 1, 1), (CHUNK, 1), (3 * CHUNK + 5, 1)]
    return out


class FaBackendSuite:
    """The suite, run where a test module subclasses it (with its own ``env`` fixture): on the CPU stand-ins
    (tests/backends/test_standin_backends.py) and on the GPU kernels (tests/gpu)."""

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    @pytest.mark.parametrize("kind", [LayerKind.FULL, LayerKind.SLIDING_WINDOW])
    @pytest.mark.parametrize("shape", sorted(REQUESTS))
    def test_fa_modes_and_layer_kinds_match_reference(self, env, shape, kind, page_size):
        plan = plan_for(env, page_size=page_size)
        layer = layer_of(env, kind, sliding_window_size=100 if kind == LayerKind.SLIDING_WINDOW else -1)
        case = make_case(env, REQUESTS[shape], MODE_OF[shape], page_size)
        expected = reference_out(env, case, plan, layer)
        assert max_diff(run(fa_backend(env, plan, case, layer), case, layer), expected) < env.tol
        # the write side stored the new tokens where the reference did
        loc = case.setup.batch.out_cache_loc
        assert torch.equal(case.pools[0].k_buffer[0][loc], case.pools[1].k_buffer[0][loc])

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fa_softcap_and_sinks_match_reference(self, env, page_size):
        plan = plan_for(env, page_size=page_size)
        layer = layer_of(
            env,
            LayerKind.SLIDING_WINDOW,
            sliding_window_size=64,
            logit_cap=30.0,
            sinks=torch.linspace(-1, 1, env.heads[0], device=env.device, dtype=torch.float32),
        )
        case = make_case(env, REQUESTS["extend_prefix"], M.EXTEND, page_size)
        assert (
            max_diff(run(fa_backend(env, plan, case, layer), case, layer), reference_out(env, case, plan, layer))
            < env.tol
        )

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    @pytest.mark.parametrize("mode", [M.EXTEND, M.DECODE])
    def test_fa_cross_attention_matches_reference(self, env, mode, page_size):
        plan = plan_for(env, page_size=page_size)
        layer = layer_of(env, LayerKind.CROSS_ATTENTION)
        enc = [128, 256, 128] if page_size > 1 else [37, 100, 1]
        requests = [(0, 5), (3, 1), (10, 7)] if mode == M.EXTEND else [(4, 1), (0, 1), (9, 1)]
        case = make_case(env, requests, mode, page_size, encoder_lens=enc)
        expected = reference_out(env, case, plan, layer, k=None, v=None)
        assert max_diff(run(fa_backend(env, plan, case, layer), case, layer, k=None, v=None), expected) < env.tol

    def test_fa_encoder_only_matches_reference_and_writes_nothing(self, env):
        plan = plan_for(env, page_size=1)
        layer = layer_of(env, LayerKind.ENCODER_ONLY)
        case = make_case(env, REQUESTS["extend"], M.EXTEND, 1)
        expected = reference_out(env, case, plan, layer)
        assert max_diff(run(fa_backend(env, plan, case, layer), case, layer), expected) < env.tol
        assert not torch.any(case.pools[0].k_buffer[0][case.setup.batch.out_cache_loc])

    def test_fa_idle_batch(self, env):
        plan = plan_for(env)
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, [(3, 1)], M.IDLE, 1)
        fa = fa_backend(env, plan, case, layer)
        fa.init_forward_metadata(case.setup.batch)
        h, _, d = env.heads
        out = fa.forward(torch.empty(0, h, d, device=env.device, dtype=env.dtype), None, None, layer, case.setup.batch)
        assert out.shape == (0, h, d)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fa_embedding_fast_path_equals_paged_path_and_reference(self, env, page_size):
        fast = plan_for(env, page_size=page_size, is_embedding=True, chunked_prefill_size=-1, disable_radix_cache=True)
        paged = plan_for(env, page_size=page_size)
        assert fast.fa.skip_kv_cache and not paged.fa.skip_kv_cache
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, REQUESTS["extend"], M.EXTEND, page_size)
        before = case.pools[0].k_buffer[0].clone()
        got_fast = run(fa_backend(env, fast, case, layer), case, layer)
        assert torch.equal(case.pools[0].k_buffer[0], before)  # nothing written
        got_paged = run(fa_backend(env, paged, case, layer), case, layer)
        expected = reference_out(env, case, paged, layer)
        assert max_diff(got_fast, got_paged) < env.tol and max_diff(got_fast, expected) < env.tol

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fa_bidirectional_window_matches_reference(self, env, page_size):
        """EmbeddingGemma's sliding-window layer: not causal, the window on both sides of a query (window_size (w, w)),
        on the embedding fast path its plan takes (R33)."""
        from tests.support.helpers import embedding_gemma

        plan = resolve(ServerArgs(attention_backend="fa4", page_size=page_size), embedding_gemma(), env.platform()).plan
        gates = plan.layer(LayerKind.SLIDING_WINDOW).common
        assert plan.fa.skip_kv_cache and not gates.causal and gates.use_window
        layer = layer_of(env, LayerKind.SLIDING_WINDOW, sliding_window_size=64)
        case = make_case(env, REQUESTS["extend"], M.EXTEND, page_size)
        expected = reference_out(env, case, plan, layer)
        assert max_diff(run(fa_backend(env, plan, case, layer), case, layer), expected) < env.tol
        causal = plan_for(
            env, page_size=page_size, is_embedding=True, chunked_prefill_size=-1, disable_radix_cache=True
        )
        assert max_diff(reference_out(env, case, causal, layer), expected) > 0.1  # the window after the query matters

    @pytest.mark.parametrize("mode", [M.DRAFT_EXTEND_V2, M.TARGET_VERIFY, M.DECODE])
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fa_cuda_graph_replay_equals_eager_and_reference(self, env, mode, page_size):
        plan = plan_for(env, page_size=page_size, **SPECULATIVE)
        assert plan.mode(mode).common.capture_cuda_graph and plan.mode(mode).fa.kv_extent == "prefix_plus_new"
        layer = layer_of(env, LayerKind.FULL)
        for i, case, replayed in replay_rounds(env, functools.partial(fa_backend, env), plan, layer, mode, page_size):
            expected = reference_out(env, case, plan, layer)
            eager_out = run(fa_backend(env, plan, case, layer), case, layer)
            assert max_diff(replayed, expected) < env.tol, f"round {i}"
            assert torch.equal(replayed, eager_out), f"round {i}: replay differs from eager"

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fa_cuda_graph_replay_reads_the_rows_given_at_replay(self, env, page_size):
        """The replay hook refills the static page table from the rows it is handed, not from the captured tensor."""
        plan = plan_for(env, page_size=page_size)
        layer = layer_of(env, LayerKind.FULL)
        assert_replays_match_reference(
            env, functools.partial(fa_backend, env), plan, layer, M.DECODE, page_size, fresh_rows=True
        )

    @pytest.mark.parametrize(
        "bs, mode, max_bs, needle",
        [
            (2, M.IDLE, 2, "forward_mode: IDLE batches replay the DECODE graph padded"),
            (2, M.EXTEND, 2, "forward_mode: the plan captures no CUDA graph for forward mode extend"),
            (0, M.DECODE, 2, r"bs: a CUDA graph serves 1 to 2 requests \(init_cuda_graph_state's max_bs\), not 0"),
            (2, M.DECODE, 1, r"bs: a CUDA graph serves 1 to 1 requests \(init_cuda_graph_state's max_bs\), not 2"),
            (2, M.DECODE, None, "init_cuda_graph_state: not called"),
        ],
    )
    def test_cuda_graph_capture_refuses_what_no_graph_serves(self, env, bs, mode, max_bs, needle):
        """IDLE batches run the padded DECODE graph, EXTEND is not captured, a graph needs a request and no more than the
        static buffers were sized for (a larger one would read slices of them shorter than itself), and the buffers must
        exist: a UsageError naming the argument from every GPU backend, before anything is allocated."""
        from attngate.errors import UsageError

        case = make_case(env, [(5, 1), (9, 1)], M.DECODE, 16)
        layer = layer_of(env, LayerKind.FULL)
        for backend in ("fa4", "flashinfer"):
            b = backend_factory(backend)(
                plan_for(env, backend, 16),
                case.pools[0],
                case.setup.req_to_token_pool.req_to_token,
                [layer],
                env.device,
            )
            if max_bs is not None:
                b.init_cuda_graph_state(max_bs, max_bs)
            rows, seq = case.setup.batch.req_pool_indices[:bs], case.setup.batch.seq_lens[:bs]
            with pytest.raises(UsageError, match=needle):
                b.init_forward_metadata_capture_cuda_graph(bs, bs, rows, seq, None, mode)

    @pytest.mark.parametrize("backend", ["fa4", "flashinfer"])
    def test_cuda_graphs_of_two_modes_at_one_batch_size_keep_their_own_metadata(self, env, backend):
        """SGLang captures decode and target-verify graphs at the same batch sizes: on one backend each graph replays with
        its own query layout (1 and 3 tokens per request), whichever was captured or replayed last; a replay of a
        (mode, batch size) never captured is a clear ValueError naming the graphs there are."""
        cls = backend_factory(backend)
        plan = plan_for(env, backend, 16, **SPECULATIVE)
        layer = layer_of(env, LayerKind.FULL)
        made = []

        def make(plan, case, layer):
            made.append(
                cls(plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], env.device, checked=True)
            )
            return made[-1]

        seen = []
        for i, case, replayed in replay_rounds(env, make, plan, layer, M.DECODE, 16, then=M.TARGET_VERIFY):
            seen.append(case.setup.batch.forward_mode)
            assert max_diff(replayed, reference_out(env, case, plan, layer)) < env.tol, f"round {i}, {seen[-1].value}"
        assert seen == [M.DECODE, M.TARGET_VERIFY] * 3
        b = case.setup.batch
        with pytest.raises(
            ValueError,
            match=r"no CUDA graph was captured for forward mode draft_extend_v2 at batch size 4 \(captured: "
            r"decode x 4, target_verify x 4\)",
        ):
            made[0].init_forward_metadata_replay_cuda_graph(
                4, b.req_pool_indices, b.seq_lens, b.seq_lens_cpu, None, M.DRAFT_EXTEND_V2
            )

    @pytest.mark.parametrize("mode", [M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND_V2])
    def test_fa_cuda_graph_replay_of_a_window_layer(self, env, mode):
        """gemma-2's sliding-window layer in every mode the plan captures, rows handed fresh at each replay."""
        plan = plan_for(env, "fa4", 128, "gemma-2-9b", **SPECULATIVE)
        assert plan.mode(mode).common.capture_cuda_graph and plan.layer(LayerKind.SLIDING_WINDOW).common.use_window
        layer = layer_of(env, LayerKind.SLIDING_WINDOW, sliding_window_size=100)
        assert_replays_match_reference(env, functools.partial(fa_backend, env), plan, layer, mode, 128, fresh_rows=True)

    @pytest.mark.parametrize("kind", [LayerKind.CROSS_ATTENTION, LayerKind.FULL])
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fa_cuda_graph_replay_with_encoder_tokens(self, env, kind, page_size):
        """An encoder-decoder decode graph: each replay's encoder lengths and rows reach the buffers the graph reads
        (the cross layer's encoder page table and lengths, the self layer's table after the encoder tokens)."""
        plan = plan_for(env, page_size=page_size)
        layer = layer_of(env, kind)
        assert_replays_match_reference(
            env,
            functools.partial(with_cross_layer, FlashAttentionBackend, env),
            plan,
            layer,
            M.DECODE,
            page_size,
            fresh_rows=True,
            encoder_pages=ENCODER_PAGES,
        )

    @pytest.mark.parametrize("mode", [M.DECODE, M.EXTEND])
    def test_fa_deterministic_batch_invariance(self, env, mode):
        plan = plan_for(env, page_size=1, enable_deterministic_inference=True)
        assert plan.fa.num_splits == 1
        layer = layer_of(env, LayerKind.FULL)
        long = env.long_prefix
        target = (long * 3 // 8, 1) if mode == M.DECODE else (long // 6, 40)
        outs = [
            target_in_batch(
                env,
                functools.partial(fa_backend, env),
                plan,
                layer,
                mode,
                others,
                target,
                max_prefix=long * 3 // 4,
                max_new=80,
                num_slots=env.many_slots // 2,
            )
            for others in (0, 7, 63)
        ]
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])

    def test_fa_checked_mode_catches_out_of_range_page(self, env):
        plan = plan_for(env, page_size=128)
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, REQUESTS["decode"], M.DECODE, 128)
        row = int(case.setup.batch.req_pool_indices[2])
        case.setup.req_to_token_pool.req_to_token[row, 0] = 10**8  # a planted slot far outside the pool
        with pytest.raises(BatchMetadataError, match="outside the pool"):
            fa_backend(env, plan, case, layer, checked=True).init_forward_metadata(case.setup.batch)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fa_scheduler_metadata_precompute_follows_the_plan(self, env, page_size):
        """flash_attn.cute never takes a precomputed schedule (FA3's, with and without DP attention, is
        tests/backends/test_fa3_provider.py's)."""
        plans = [
            plan_for(env, page_size=page_size),
            plan_for(env, page_size=page_size, enable_dp_attention=True, dp_size=2, tp_size=2),
        ]
        assert not any(plan.fa.precompute_scheduler_metadata for plan in plans)
        layer = layer_of(env, LayerKind.FULL)
        expected = reference_out(env, make_case(env, REQUESTS["decode"], M.DECODE, page_size), plans[0], layer)
        for plan in plans:
            case = make_case(env, REQUESTS["decode"], M.DECODE, page_size)
            fa = fa_backend(env, plan, case, layer)
            out = run(fa, case, layer)
            assert (fa.md.scheduler_metadata is not None) is plan.fa.precompute_scheduler_metadata
            assert max_diff(out, expected) < env.tol

    @pytest.mark.parametrize("page_size", [1, 64])
    @pytest.mark.parametrize("shape", sorted(MODE_OF))
    def test_fa_chunked_local_matches_reference(self, env, shape, page_size):
        plan = plan_for(env, "fa3", page_size, "Llama-4-Scout-17B-16E-Instruct")
        layer = layer_of(env, LayerKind.CHUNKED_LOCAL, attention_chunk_size=CHUNK)
        case = make_case(env, local_requests(64)[shape], MODE_OF[shape], page_size)
        expected = reference_out(env, case, plan, layer)
        assert rel_err(run(fa_backend(env, plan, case, layer, checked=True), case, layer), expected) < env.tol

    @pytest.mark.parametrize("page_size", [1, 64])
    def test_fa_chunked_local_cuda_graph_decode_replay(self, env, page_size):
        plan = plan_for(env, "fa3", page_size, "Llama-4-Scout-17B-16E-Instruct")
        assert (
            not plan.mode("target_verify").common.capture_cuda_graph and plan.mode("decode").common.capture_cuda_graph
        )
        layer = layer_of(env, LayerKind.CHUNKED_LOCAL, attention_chunk_size=CHUNK)
        for i, case, out in replay_rounds(env, functools.partial(fa_backend, env), plan, layer, M.DECODE, page_size):
            assert rel_err(out, reference_out(env, case, plan, layer)) < env.tol, f"round {i}"

    def test_fa_verifies_chains_only_and_says_so(self, env):
        """attngate's FA backend has no tree verify (SGLang's cascade path is a known failure): a tree plan, resolved only
        with the known failure allowed, is refused at construction, and a tree batch under a chain plan at its metadata."""
        facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
        tree_plan = resolve(
            ServerArgs(attention_backend="fa3", page_size=1, **SPECULATIVE_TREE),
            facts,
            env.platform(),
            allow_known_failures=["known.fa-eagle-tree-verify-drift"],
        ).plan
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, [(5, 8), (40, 8)], M.TARGET_VERIFY, 1)
        with pytest.raises(
            BackendRefusal, match="common.tree_mask: attngate's FA backend verifies speculative chains only"
        ):
            fa_backend(env, tree_plan, case, layer)
        case.setup.batch.spec_tree_mask = random_tree(2, 8, seed=0, device=env.device)
        with pytest.raises(BatchMetadataError, match="spec_tree_mask: given"):
            fa_backend(env, plan_for(env, "fa3", 1, **SPECULATIVE), case, layer).init_forward_metadata(case.setup.batch)

    def test_fa_reads_16_bit_kv_caches_only_and_says_so(self, env):
        """An FP8 KV cache needs descale tensors, which attngate's FA backend does not compute: the plan for one (fa4 on SM100,
        where flash_attn.cute reads FP8) is refused at construction, naming the backend that reads it."""
        plan = resolve(
            ServerArgs(attention_backend="fa4", kv_cache_dtype="fp8_e4m3"),
            ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json"),
            Platform.from_name("sm100"),
        ).plan
        case = make_case(env, [(5, 1), (40, 1)], M.DECODE, plan.common.page_size, kv_dtype=torch.float8_e4m3fn)
        with pytest.raises(
            BackendRefusal, match="common.kv_cache_dtype: 'fp8_e4m3': attngate's FA backend reads 16-bit KV caches only"
        ):
            fa_backend(env, plan, case, layer_of(env, LayerKind.FULL))
