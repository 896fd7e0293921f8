"""PlanBackend against the reference backend: a plan whose prefill (FA) and decode (FlashInfer) backends differ runs
each forward mode, eagerly and as CUDA graphs, on the backend ``common.runs_on`` names (SGLang's HybridAttnBackend),
both backends over one KV pool (bf16, GQA, page sizes 1 and 128)."""

from __future__ import annotations

from unittest import mock

import pytest

from attngate import ForwardMode
from attngate.backends.flashattention import FlashAttentionBackend
from attngate.backends.flashinfer import FlashInferBackend
from attngate.backends.plan_backend import PlanBackend
from attngate.errors import BackendRefusal
from attngate.facts.modes import LayerKind
from tests.support.backend_cases import (
    MODE_OF,
    SPECULATIVE,
    Env,
    assert_replays_match_reference,
    layer_of,
    make_case,
    max_diff,
    plan_for,
    reference_out,
    requests_around_page,
    run,
)

M = ForwardMode
PAGE_SIZES = [1, 128]
REQUESTS = requests_around_page(PAGE_SIZES[-1])
SPLIT = dict(prefill_attention_backend="fa3", decode_attention_backend="flashinfer")


def split_plan(env: Env, page_size: int, verify_on: str):
    return plan_for(env, None, page_size, **SPLIT, **SPECULATIVE, speculative_attention_mode=verify_on)


def plan_backend(env: Env, plan, case, layer) -> PlanBackend:
    return PlanBackend(plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], env.device)


class PlanBackendSuite:
    """The suite, run where a test module subclasses it (with its own ``env`` fixture): on the CPU stand-ins
    (tests/backends/test_standin_backends.py) and on the GPU kernels (tests/gpu)."""

    @pytest.mark.parametrize("verify_on", ["prefill", "decode"])
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    @pytest.mark.parametrize("shape", ["extend_prefix", "decode", "target_verify", "draft_extend_v2"])
    def test_each_mode_runs_on_the_backend_the_plan_names(self, env, shape, page_size, verify_on):
        plan = split_plan(env, page_size, verify_on)
        mode = MODE_OF[shape]
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, REQUESTS[shape], mode, page_size)
        backend = plan_backend(env, plan, case, layer)
        fa, fi = (
            next(b for b in backend.backends if isinstance(b, cls))
            for cls in (FlashAttentionBackend, FlashInferBackend)
        )
        want = fi if plan.backend_for(mode) == "flashinfer" else fa
        assert backend.backend_of(mode) is want
        assert (want is fi) == (mode == M.DECODE or (mode == M.TARGET_VERIFY and verify_on == "decode"))
        with (
            mock.patch.object(fa, "forward", wraps=fa.forward) as fa_forward,
            mock.patch.object(fi, "forward", wraps=fi.forward) as fi_forward,
        ):
            out = run(backend, case, layer)
        assert (fa_forward.call_count, fi_forward.call_count) == ((0, 1) if want is fi else (1, 0))
        assert max_diff(out, reference_out(env, case, plan, layer)) < env.tol

    @pytest.mark.parametrize("verify_on", ["prefill", "decode"])
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_decode_and_verify_graphs_replay_on_their_backends(self, env, page_size, verify_on):
        """A decode graph and a target-verify graph of one batch size on one PlanBackend, replayed in turn: under
        --speculative-attention-mode prefill the two live on different backends and keep their own metadata."""
        plan = split_plan(env, page_size, verify_on)
        assert_replays_match_reference(
            env,
            lambda p, case, layer: plan_backend(env, p, case, layer),
            plan,
            layer_of(env, LayerKind.FULL),
            M.DECODE,
            page_size,
            then=M.TARGET_VERIFY,
        )

    def test_one_backend_serves_both_sides_where_the_plan_names_one(self, env):
        plan = plan_for(env, "fa3", 128)
        case = make_case(env, REQUESTS["decode"], M.DECODE, 128)
        backend = plan_backend(env, plan, case, layer_of(env, LayerKind.FULL))
        assert len(backend.backends) == 1 and all(backend.backend_of(m) is backend.backends[0] for m in M)

    def test_a_side_attngate_has_no_backend_for_is_refused_by_name(self, env):
        plan = plan_for(env, None, 1, prefill_attention_backend="triton", decode_attention_backend="flashinfer")
        case = make_case(env, REQUESTS["decode"], M.DECODE, 1)
        with pytest.raises(
            BackendRefusal, match=r"prefill_backend: 'triton': attngate runs fa3, fa4, flashinfer on GPU kernels"
        ):
            plan_backend(env, plan, case, layer_of(env, LayerKind.FULL))
