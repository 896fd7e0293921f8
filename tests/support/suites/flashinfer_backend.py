"""The FlashInfer backend against the reference backend (bf16, GQA, page sizes 1 and 16)."""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

from attngate import ForwardMode, LayerKind
from attngate.backends.flashinfer import FlashInferBackend
from attngate.backends.runtime.kv_cache import MHATokenToKVPool
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BatchMetadataError, UsageError
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
    replay_rounds,
    requests_around_page,
    run,
    target_in_batch,
    with_cross_layer,
    with_gate,
)

M = ForwardMode
PAGE_SIZES = [1, 16]
REQUESTS = requests_around_page(PAGE_SIZES[-1])
# layer kind -> (model whose plan dispatches it, layer kwargs)
KINDS = {
    LayerKind.FULL: ("Llama-3.1-8B", {}),
    LayerKind.SLIDING_WINDOW: ("Mistral-7B-v0.1", {"sliding_window_size": 100}),
}


def fi_backend(env: Env, plan, case, layer, **kw) -> FlashInferBackend:
    return FlashInferBackend(plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], env.device, **kw)


def _family(wrapper) -> str:
    return getattr(wrapper, "_backend", None) or wrapper.backend  # FlashInfer keeps it private, the stand-in public


def _target_in_batches(env, plan, kind, mode, others: int, layer, encoder=None):
    """The output rows of one fixed request placed in the middle of a batch of `others` other requests."""
    long = env.long_prefix
    target = (long * 3 // 4, 1) if mode == M.DECODE else (long // 2, 60)
    return target_in_batch(
        env,
        functools.partial(fi_backend, env),
        plan,
        layer,
        mode,
        others,
        target,
        max_prefix=long,
        max_new=90,
        num_slots=env.many_slots,
        encoder=encoder,
        kv_from_cache=kind == LayerKind.CROSS_ATTENTION,
    )


def _spy_on_fast_decode_plan(monkeypatch) -> list:
    """The wrappers ``flashinfer.fast_decode_plan`` is called on, in order (it still runs)."""
    fi, calls = importlib.import_module("flashinfer"), []
    fast = fi.fast_decode_plan
    monkeypatch.setattr(fi, "fast_decode_plan", lambda *a, **kw: (calls.append(a[0]), fast(*a, **kw))[1])
    return calls


TREE_REQUESTS = [(5, 8), (15, 8), (130, 8), (300, 8)]  # prefixes around a 16-token page, one past the window below


class FlashInferBackendSuite:
    """The suite, run where a test module subclasses it (with its own ``env`` fixture): on the CPU stand-ins
    (tests/backends/test_standin_backends.py) and on the GPU kernels (tests/gpu)."""

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    @pytest.mark.parametrize("kind", sorted(KINDS, key=lambda k: k.value))
    @pytest.mark.parametrize("shape", sorted(REQUESTS))
    def test_fi_modes_and_layer_kinds_match_reference(self, env, shape, kind, page_size):
        model, kw = KINDS[kind]
        plan = plan_for(env, "flashinfer", page_size, model)
        layer = layer_of(env, kind, **kw)
        case = make_case(env, REQUESTS[shape], MODE_OF[shape], page_size)
        expected = reference_out(env, case, plan, layer)
        assert max_diff(run(fi_backend(env, plan, case, layer), case, layer), expected) < env.tol
        loc = case.setup.batch.out_cache_loc
        assert torch.equal(case.pools[0].k_buffer[0][loc], case.pools[1].k_buffer[0][loc])

    def test_fi_every_wrapper_runs_the_plans_kernel_family(self, env):
        """No wrapper is left on FlashInfer's 'auto' (which re-probes for cuDNN on every decode plan()): eager and
        CUDA-graph decode wrappers take flashinfer.decode_kernel_family, prefill wrappers prefill_kernel_family."""
        plan = plan_for(
            env,
            "flashinfer",
            16,
            "Llama-3.1-8B",
            speculative_algorithm="EAGLE",
            speculative_eagle_topk=1,
            speculative_num_steps=3,
            speculative_num_draft_tokens=4,
        )
        layer = layer_of(env, LayerKind.FULL)
        fi = fi_backend(env, plan, make_case(env, REQUESTS["decode"], M.DECODE, 16), layer)
        fi.init_cuda_graph_state(4, 16)
        for mode in (M.DECODE, M.TARGET_VERIFY):
            fi.init_forward_metadata_capture_cuda_graph(
                4,
                4 * (1 if mode == M.DECODE else 4),
                fi.req_to_token.new_zeros(4),
                fi.req_to_token.new_ones(4) * 8,
                None,
                mode,
            )
        gates = plan.flashinfer
        decode = fi.wrappers.decode + fi.graphs.captured(M.DECODE, 4).wrappers
        prefill = fi.wrappers.paged + fi.wrappers.ragged + fi.graphs.captured(M.TARGET_VERIFY, 4).wrappers
        assert {_family(w) for w in decode} == {gates.decode_kernel_family}
        assert {_family(w) for w in prefill} == {gates.prefill_kernel_family}

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fi_sliding_window_prefix_longer_than_window_through_ragged_and_paged(self, env, page_size):
        plan = plan_for(env, "flashinfer", page_size, "Mistral-7B-v0.1")
        assert plan.flashinfer.use_ragged_prefill and plan.flashinfer.wrapper_dispatch == "sliding_window"
        layer = layer_of(env, LayerKind.SLIDING_WINDOW, sliding_window_size=48)
        case = make_case(env, [(300, 20), (49, 70), (47, 3), (1000, 100)], M.EXTEND, page_size)
        backend = fi_backend(env, plan, case, layer)
        out = run(backend, case, layer)
        assert backend._batch_path == "ragged_paged"
        assert max_diff(out, reference_out(env, case, plan, layer)) < env.tol

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fi_softcap_matches_reference(self, env, page_size):
        plan = plan_for(env, "flashinfer", page_size, "gemma-2-9b")
        layer = layer_of(env, LayerKind.SLIDING_WINDOW, sliding_window_size=64, logit_cap=30.0)
        case = make_case(env, REQUESTS["extend_prefix"], M.EXTEND, page_size)
        assert (
            max_diff(run(fi_backend(env, plan, case, layer), case, layer), reference_out(env, case, plan, layer))
            < env.tol
        )

    @pytest.mark.parametrize("mode", [M.EXTEND, M.DECODE])
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fi_cross_attention_matches_reference(self, env, mode, page_size):
        plan = plan_for(env, "flashinfer", page_size, "whisper-large-v3-turbo")
        assert plan.flashinfer.wrapper_dispatch == "cross_attention"
        layer = layer_of(env, LayerKind.CROSS_ATTENTION)
        enc = [32, 64, 16] if page_size > 1 else [37, 100, 1]
        requests = [(0, 5), (3, 1), (10, 7)] if mode == M.EXTEND else [(4, 1), (0, 1), (9, 1)]
        case = make_case(env, requests, mode, page_size, encoder_lens=enc)
        expected = reference_out(env, case, plan, layer, k=None, v=None)
        assert max_diff(run(fi_backend(env, plan, case, layer), case, layer, k=None, v=None), expected) < env.tol

    def test_fi_idle_batch(self, env):
        plan = plan_for(env, "flashinfer")
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, [(3, 1)], M.IDLE, 1)
        backend = fi_backend(env, plan, case, layer)
        backend.init_forward_metadata(case.setup.batch)
        h, _, d = env.heads
        q = torch.empty(0, h, d, device=env.device, dtype=env.dtype)
        assert backend.forward(q, None, None, layer, case.setup.batch).shape == (0, h, d)

    @pytest.mark.parametrize(
        "kind, model, kw",
        [
            (LayerKind.FULL, "Llama-3.1-8B", {}),
            (LayerKind.SLIDING_WINDOW, "Mistral-7B-v0.1", {"sliding_window_size": 1000}),
            (LayerKind.CROSS_ATTENTION, "whisper-large-v3-turbo", {}),
        ],
    )
    @pytest.mark.parametrize("mode", [M.DECODE, M.EXTEND])
    def test_fi_deterministic_batch_invariance_every_wrapper_kind(self, env, kind, model, kw, mode):
        plan = plan_for(env, "flashinfer", 1, model, enable_deterministic_inference=True)
        assert (plan.flashinfer.prefill_fixed_split_size, plan.flashinfer.decode_fixed_split_size) == (4096, 2048)
        layer = layer_of(env, kind, **kw)
        encoder = env.long_prefix * 3 // 8 if kind == LayerKind.CROSS_ATTENTION else None
        outs = [_target_in_batches(env, plan, kind, mode, others, layer, encoder=encoder) for others in (0, 7, 63)]
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])

    def test_fi_without_deterministic_mode_batch_invariance_is_not_guaranteed(self, env):
        plan = plan_for(env, "flashinfer", 1, "Llama-3.1-8B")
        assert plan.flashinfer.decode_fixed_split_size is None
        layer = layer_of(env, LayerKind.FULL)
        outs = [_target_in_batches(env, plan, LayerKind.FULL, M.DECODE, others, layer) for others in (0, 63)]
        # a lone long request is split across many CTAs, inside a full batch it is not: the reduction order differs
        assert not torch.equal(outs[0], outs[1])
        assert max_diff(outs[0], outs[1]) < env.tol

    @pytest.mark.parametrize("mode", [M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND_V2])
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fi_cuda_graph_replay_equals_eager(self, env, mode, page_size):
        plan = plan_for(env, "flashinfer", page_size, "Llama-3.1-8B", **SPECULATIVE)
        assert plan.mode(mode).common.capture_cuda_graph
        layer = layer_of(env, LayerKind.FULL)
        for i, case, replayed in replay_rounds(env, functools.partial(fi_backend, env), plan, layer, mode, page_size):
            assert max_diff(replayed, reference_out(env, case, plan, layer)) < env.tol, f"round {i}"
            eager = fi_backend(env, plan, case, layer)
            assert max_diff(replayed, run(eager, case, layer)) < env.tol, f"round {i}"

    @pytest.mark.parametrize("replan", ["plan", "fast_decode_plan"])
    def test_fi_cuda_graph_decode_replays_replan_as_the_plan_says(self, env, replan, monkeypatch):
        """flashinfer.graph_decode_replan: every decode replay re-plans its wrappers by plan(), or by FlashInfer's
        fast_decode_plan (rule flashinfer.graph-decode-fast-replan), which copies nothing into the static buffers; the
        capture runs plan() either way. Both match the reference, a window layer's ranges (first tokens) included."""
        shipped = plan_for(env, "flashinfer", 16, "Mistral-7B-v0.1")
        assert shipped.flashinfer.graph_decode_replan == "fast_decode_plan"
        plan = with_gate(shipped, "flashinfer.graph_decode_replan", replan)
        calls = _spy_on_fast_decode_plan(monkeypatch)
        layer = layer_of(env, LayerKind.SLIDING_WINDOW, sliding_window_size=100)
        rounds = 0
        for i, case, replayed in replay_rounds(env, functools.partial(fi_backend, env), plan, layer, M.DECODE, 16):
            assert max_diff(replayed, reference_out(env, case, plan, layer)) < env.tol, f"round {i}"
            rounds += 1
        wrappers = 2  # sliding_window dispatch: the window layers' wrapper and the full layers'
        assert len(calls) == (rounds * wrappers if replan == "fast_decode_plan" else 0)

    @pytest.mark.parametrize("replan", ["plan", "fast_decode_plan"])
    def test_fi_eager_decode_replans_as_the_plan_says(self, env, replan, monkeypatch):
        """flashinfer.eager_decode_replan: an eager decode wrapper's first batch runs plan(); later batches plan() again or
        FlashInfer's fast_decode_plan over the device page ranges the page-id build copied (rule
        flashinfer.eager-decode-fast-replan, page_size 1). Three batches of other sizes and lengths on one backend, GQA with
        tensor-core decode (Llama-3.1-8B's group of 4), each against the reference."""
        shipped = plan_for(env, "flashinfer", 1, "Llama-3.1-8B")
        assert (
            shipped.flashinfer.eager_decode_replan == "fast_decode_plan" and shipped.flashinfer.decode_use_tensor_cores
        )
        assert plan_for(env, "flashinfer", 16, "Llama-3.1-8B").flashinfer.eager_decode_replan == "plan"
        plan = with_gate(shipped, "flashinfer.eager_decode_replan", replan)
        calls = _spy_on_fast_decode_plan(monkeypatch)
        layer = layer_of(env, LayerKind.FULL)
        batches = [
            [(900, 1), (0, 1), (77, 1), (1, 1), (300, 1), (12, 1)],
            REQUESTS["decode"],
            [(40, 1), (3, 1)],
        ]  # largest first
        backend = None
        for i, requests in enumerate(batches):
            case = make_case(env, requests, M.DECODE, 1, seed=i)
            if backend is None:
                backend = fi_backend(env, plan, case, layer)
            else:  # the same backend, its wrapper planned before: this batch's cache and request table copied into its own
                backend.kv_pool.k_buffer[0].copy_(case.pools[0].k_buffer[0])
                backend.kv_pool.v_buffer[0].copy_(case.pools[0].v_buffer[0])
                rtt = case.setup.req_to_token_pool.req_to_token
                backend.req_to_token[: rtt.shape[0]].copy_(rtt)
            assert max_diff(run(backend, case, layer), reference_out(env, case, plan, layer)) < env.tol, f"batch {i}"
        assert len(calls) == (len(batches) - 1 if replan == "fast_decode_plan" else 0)
        assert all(w is backend.wrappers.decode[0] for w in calls)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    @pytest.mark.parametrize("shape", ["extend_prefix", "decode", "target_verify"])
    def test_fi_fp8_kv_cache_matches_reference(self, env, shape, page_size):
        """--kv-cache-dtype fp8_e4m3: the pool stores FP8 (what the plan's common.kv_cache_dtype says), every paged plan
        reads it as FP8 and the ragged half reads the raw K/V in the model's dtype. K/V are drawn FP8-representable, so the
        backend matches the reference to the usual tolerance."""
        plan = plan_for(env, "flashinfer", page_size, "Llama-3.1-8B", kv_cache_dtype="fp8_e4m3", **SPECULATIVE)
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, REQUESTS[shape], MODE_OF[shape], page_size, kv_dtype=torch.float8_e4m3fn)
        expected = reference_out(env, case, plan, layer)
        assert max_diff(run(fi_backend(env, plan, case, layer, q_dtype=env.dtype), case, layer), expected) < env.tol

    @pytest.mark.parametrize("mode", [M.DECODE, M.TARGET_VERIFY])
    def test_fi_fp8_kv_cache_cuda_graph_replays(self, env, mode):
        plan = plan_for(env, "flashinfer", 16, "Llama-3.1-8B", kv_cache_dtype="fp8_e4m3", **SPECULATIVE)
        assert_replays_match_reference(
            env,
            functools.partial(fi_backend, env, q_dtype=env.dtype),
            plan,
            layer_of(env, LayerKind.FULL),
            mode,
            16,
            fresh_rows=True,
            kv_dtype=torch.float8_e4m3fn,
        )

    def test_fi_kv_cache_dtype_follows_the_plan(self, env):
        """A pool of another dtype than the plan's kv_cache_dtype, a cache dtype attngate stores no pool for, and an FP8
        pool without the model's dtype for the queries are each refused at construction."""
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, REQUESTS["decode"], M.DECODE, 16)  # a 16-bit pool
        with pytest.raises(
            BatchMetadataError, match="kv_pool: holds torch.bfloat16, the plan's kv_cache_dtype 'fp8_e4m3'"
        ):
            fi_backend(env, plan_for(env, "flashinfer", 16, kv_cache_dtype="fp8_e4m3"), case, layer)
        fp8 = make_case(env, REQUESTS["decode"], M.DECODE, 16, kv_dtype=torch.float8_e4m3fn)
        with pytest.raises(UsageError, match="q_dtype: needed with a torch.float8_e4m3fn KV pool"):
            fi_backend(env, plan_for(env, "flashinfer", 16, kv_cache_dtype="fp8_e4m3"), fp8, layer)
        with pytest.raises(
            BatchMetadataError, match="kv_pool: holds torch.float8_e4m3fn, the plan's kv_cache_dtype 'fp8_e5m2'"
        ):
            fi_backend(env, plan_for(env, "flashinfer", 16, kv_cache_dtype="fp8_e5m2"), fp8, layer, q_dtype=env.dtype)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    @pytest.mark.parametrize("kind", sorted(KINDS, key=lambda k: k.value))
    def test_fi_tree_verify_matches_reference(self, env, kind, page_size):
        """EAGLE with topk > 1 verifies a tree: each draft token sees the prefix and its ancestors (spec_tree_mask through
        the paged wrapper's custom mask, a window layer's window folded into it). The tree changes the output, so a
        backend that verified the flattened tokens as a chain would fail here."""
        model, kw = KINDS[kind]
        plan = plan_for(env, "flashinfer", page_size, model, **SPECULATIVE_TREE)
        assert plan.mode(M.TARGET_VERIFY).common.tree_mask and not plan.mode(M.DRAFT_EXTEND_V2).common.tree_mask
        layer = layer_of(env, kind, **kw)
        case = make_case(env, TREE_REQUESTS, M.TARGET_VERIFY, page_size)
        case.setup.batch.spec_tree_mask = random_tree(len(TREE_REQUESTS), 8, seed=3, device=env.device)
        expected = reference_out(env, case, plan, layer)
        assert max_diff(run(fi_backend(env, plan, case, layer), case, layer), expected) < env.tol
        chain = plan_for(env, "flashinfer", page_size, model, **SPECULATIVE)
        case.setup.batch.spec_tree_mask = None
        assert max_diff(reference_out(env, case, chain, layer), expected) > 10 * env.tol  # the tree matters

    @pytest.mark.parametrize("kind", sorted(KINDS, key=lambda k: k.value))
    def test_fi_tree_verify_cuda_graph_replays_each_rounds_tree(self, env, kind):
        """A captured tree verify replays with each round's own tree in the graph's mask buffers (rows handed fresh)."""
        model, kw = KINDS[kind]
        plan = plan_for(env, "flashinfer", 16, model, **SPECULATIVE_TREE)
        layer = layer_of(env, kind, **kw)
        assert_replays_match_reference(
            env, functools.partial(fi_backend, env), plan, layer, M.TARGET_VERIFY, 16, fresh_rows=True, tree=True
        )

    def test_fi_tree_and_chain_batches_must_match_the_plan(self, env):
        """A tree plan's verify without its tree, or a chain plan's with one, is refused (eager and at replay), never
        verified with the wrong mask."""
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, TREE_REQUESTS, M.TARGET_VERIFY, 16)
        b = case.setup.batch
        tree_plan, chain_plan = (plan_for(env, "flashinfer", 16, **args) for args in (SPECULATIVE_TREE, SPECULATIVE))
        with pytest.raises(BatchMetadataError, match="spec_tree_mask: missing"):
            fi_backend(env, tree_plan, case, layer).init_forward_metadata(b)
        b.spec_tree_mask = random_tree(len(TREE_REQUESTS), 8, seed=0, device=env.device)
        with pytest.raises(
            BatchMetadataError, match="spec_tree_mask: given, but the plan's target_verify attends causally"
        ):
            fi_backend(env, chain_plan, case, layer).init_forward_metadata(b)
        b.spec_tree_mask = b.spec_tree_mask[:, :4, :4]
        with pytest.raises(BatchMetadataError, match=r"must be \[4, 8, 8\] bool"):
            fi_backend(env, tree_plan, case, layer).init_forward_metadata(b)
        fi = fi_backend(env, tree_plan, case, layer)
        fi.init_cuda_graph_state(4, 32)
        fi.init_forward_metadata_capture_cuda_graph(4, 32, b.req_pool_indices, b.seq_lens, None, M.TARGET_VERIFY)
        with pytest.raises(BatchMetadataError, match="spec_tree_mask: missing"):
            fi.init_forward_metadata_replay_cuda_graph(
                4, b.req_pool_indices, b.seq_lens, b.seq_lens_cpu, None, M.TARGET_VERIFY
            )

    @pytest.mark.parametrize("model", ["Llama-3.1-8B", "gemma-2-9b"])
    def test_fi_cuda_graph_builds_page_ids_from_the_rows_given_at_replay(self, env, model):
        """The graph fills its page ids from its own static rows, copied from whatever tensor the replay is given;
        gemma-2 (window and full layers, two wrappers) also exercises the window's first-token buffer."""
        plan = plan_for(env, "flashinfer", 16, model)
        kinds = [LayerKind.SLIDING_WINDOW, LayerKind.FULL] if model == "gemma-2-9b" else [LayerKind.FULL]
        for kind in kinds:
            layer = layer_of(env, kind, **({"sliding_window_size": 100} if kind == LayerKind.SLIDING_WINDOW else {}))
            assert_replays_match_reference(
                env, functools.partial(fi_backend, env), plan, layer, M.DECODE, 16, fresh_rows=True
            )

    @pytest.mark.parametrize("mode", [M.TARGET_VERIFY, M.DRAFT_EXTEND_V2])
    def test_fi_cuda_graph_replay_of_a_window_layer_with_draft_tokens(self, env, mode):
        """gemma-2's sliding-window layer in the captured prefill-wrapper modes (several tokens per request): the window's
        first tokens reach the graph's buffers at each replay, rows handed fresh."""
        plan = plan_for(env, "flashinfer", 16, "gemma-2-9b", **SPECULATIVE)
        assert plan.mode(mode).common.capture_cuda_graph
        layer = layer_of(env, LayerKind.SLIDING_WINDOW, sliding_window_size=100)
        assert_replays_match_reference(env, functools.partial(fi_backend, env), plan, layer, mode, 16, fresh_rows=True)

    @pytest.mark.parametrize("kind", [LayerKind.CROSS_ATTENTION, LayerKind.FULL])
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fi_cuda_graph_replay_with_encoder_tokens(self, env, kind, page_size):
        """Whisper's decode graph: each replay's encoder lengths and rows reach the cross wrapper's page ids and the
        self-attention wrapper's first tokens (its ranges start after the encoder tokens)."""
        plan = plan_for(env, "flashinfer", page_size, "whisper-large-v3-turbo")
        layer = layer_of(env, kind)
        assert_replays_match_reference(
            env,
            functools.partial(with_cross_layer, FlashInferBackend, env),
            plan,
            layer,
            M.DECODE,
            page_size,
            fresh_rows=True,
            encoder_pages=ENCODER_PAGES,
        )

    def test_fi_cuda_graph_forward_must_run_each_wrappers_first_layer_first(self, env):
        """The first layer of a wrapper fills the graph's page ids; a captured forward that starts elsewhere would read
        stale ones, so it is refused, naming the layer to run first."""
        plan = plan_for(env, "flashinfer", 16)
        h, hkv, d = env.heads
        layers = [AttentionLayer(i, h, hkv, d, d, d**-0.5, kind=LayerKind.FULL) for i in (3, 4)]
        case = make_case(env, [(5, 1), (40, 1)], M.DECODE, 16)
        pool = MHATokenToKVPool(1 << 16, 16, 5, hkv, d, dtype=env.dtype, device=env.device)
        fi = FlashInferBackend(plan, pool, case.setup.req_to_token_pool.req_to_token, layers, env.device)
        fi.init_cuda_graph_state(2, 2)
        b = case.setup.batch
        fi.init_forward_metadata_capture_cuda_graph(2, 2, b.req_pool_indices, b.seq_lens, None, M.DECODE)
        with pytest.raises(BatchMetadataError, match="runs layer 3 first"):
            fi.forward(case.q, case.k, case.v, layers[1], b)
        fi.forward(case.q, case.k, case.v, layers[0], b)
        fi.forward(case.q, case.k, case.v, layers[1], b)  # layer 3 filled them

    def test_fi_cuda_graph_of_a_decoder_only_model_refuses_encoder_tokens(self, env):
        """The captured page-id fill of a layer set without window or cross attention reads every range from token 0;
        a replay whose ranges would start after encoder tokens is refused, not read from the wrong tokens."""
        plan = plan_for(env, "flashinfer", 16)
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, [(5, 1), (40, 1)], M.DECODE, 16)
        fi = fi_backend(env, plan, case, layer)
        fi.init_cuda_graph_state(2, 2)
        b = case.setup.batch
        fi.init_forward_metadata_capture_cuda_graph(2, 2, b.req_pool_indices, b.seq_lens, None, M.DECODE)
        enc = torch.full((2,), 16, dtype=torch.int32, device=env.device)
        with pytest.raises(BatchMetadataError, match="encoder_lens"):
            fi.init_forward_metadata_replay_cuda_graph(
                2, b.req_pool_indices, b.seq_lens + 16, b.seq_lens_cpu + 16, enc, M.DECODE
            )

    def test_fi_checked_mode_catches_out_of_range_slot(self, env):
        plan = plan_for(env, "flashinfer", 16)
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, REQUESTS["decode"], M.DECODE, 16)
        case.setup.batch.out_cache_loc[1] = 10**9  # a planted slot far outside the pool
        with pytest.raises(BatchMetadataError, match="outside the pool"):
            fi_backend(env, plan, case, layer, checked=True).init_forward_metadata(case.setup.batch)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    @pytest.mark.parametrize("det", [False, True], ids=["default", "deterministic"])
    def test_fi_encoder_only_layers_match_reference(self, env, det, page_size):
        """Bidirectional layers (embedding models such as gte-Qwen2): by default the ragged wrapper on the raw
        K/V; under deterministic inference the paged wrapper reads the K/V the layer wrote first (rule
        layer.encoder-only-writes-no-cache), where skipping the write once read stale slots."""
        plan = plan_for(
            env, "flashinfer", page_size, "gte-Qwen2-7B-instruct", is_embedding=True, enable_deterministic_inference=det
        )
        layer = layer_of(env, LayerKind.ENCODER_ONLY)
        case = make_case(env, REQUESTS["extend"], M.EXTEND, page_size)
        fi = fi_backend(env, plan, case, layer)
        assert max_diff(run(fi, case, layer), reference_out(env, case, plan, layer)) < env.tol
        assert fi._batch_path == ("paged" if det else "ragged")

    def test_fi_encoder_only_layer_with_a_cached_prefix_is_a_clear_error(self, env):
        plan = plan_for(env, "flashinfer", 1, "gte-Qwen2-7B-instruct", is_embedding=True)
        layer = layer_of(env, LayerKind.ENCODER_ONLY)
        case = make_case(env, [(5, 3), (0, 4)], M.EXTEND, 1)
        with pytest.raises(BatchMetadataError, match="cannot attend to a cached prefix"):
            run(fi_backend(env, plan, case, layer), case, layer)
