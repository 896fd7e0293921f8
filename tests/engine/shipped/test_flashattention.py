"""rules.yaml "FlashAttention (FA3/FA4) backend": fa.skip_kv_cache exhaustively over the facts it names,
fa.precompute_scheduler_metadata, and FA's page constraints."""

from __future__ import annotations

import itertools

import pytest
import z3

from attngate import LayerKind, PlanError, Platform, ServerArgs, resolve
from attngate.analysis.encoding import Encoder
from tests.support.helpers import fa3_gpu, model, refusing_rules_of, resolve_flags

FA_GPU = {"fa3": "sm90", "fa4": "sm100", "flashinfer": "sm90"}


@pytest.mark.parametrize("backend", ["fa3", "fa4", "flashinfer"])
@pytest.mark.parametrize("name", ["Qwen3-Embedding-8B", "DeepSeek-V2-Lite"])
def test_skip_kv_cache_exhaustive(backend, name):
    m = model(name)
    for is_emb, cps, no_radix in itertools.product([False, True], [-1, None, 8192], [False, True]):
        args = ServerArgs(
            attention_backend=backend, is_embedding=is_emb, chunked_prefill_size=cps, disable_radix_cache=no_radix
        )
        try:
            r = resolve(args, m, fa3_gpu(FA_GPU[backend]))
        except PlanError as err:
            assert backend == "fa4" and m.use_mla is False or backend == "fa4", err
            continue
        expected = backend in ("fa3", "fa4") and is_emb and cps == -1 and no_radix and not m.use_mla
        assert r.plan.fa.skip_kv_cache is expected
        assert r.plan.layer(LayerKind.FULL).common.write_kv_cache is not expected  # what every backend reads
        # the read side reads the same decision: EXTEND then reads no cache at all
        assert (r.plan.mode("extend").fa.kv_extent == "none") is expected
        e = r.explanation.gates["fa.skip_kv_cache"]
        assert e.origin == ("fa.skip-kv-cache-for-embedding" if expected else "default")
        assert e.facts["use_mla"] is m.use_mla


def test_embedding_architectures_turn_embedding_mode_on():
    """R32: a checkpoint declaring an embedding-only architecture (e5-mistral's MistralModel, BertModel) serves as an
    embedding model without --is-embedding, so the FA fast path applies; a decoder checkpoint trained for embeddings
    (Qwen3-Embedding, Qwen3ForCausalLM) still needs the flag."""
    fast_path = dict(attention_backend="fa3", chunked_prefill_size=-1, disable_radix_cache=True)
    r = resolve(ServerArgs(**fast_path), model("e5-mistral-7b-instruct"), fa3_gpu())
    assert r.server_args.is_embedding and r.plan.fa.skip_kv_cache
    assert [a.rule for a in r.adjustments if a.field == "is_embedding"] == [
        "embedding.auto-enable-for-embedding-architectures"
    ]
    r = resolve(ServerArgs(**fast_path), model("Qwen3-Embedding-8B"), fa3_gpu())
    assert not r.server_args.is_embedding and not r.plan.fa.skip_kv_cache
    r = resolve(ServerArgs(**fast_path, is_embedding=True), model("all-MiniLM-L6-v2"), fa3_gpu())
    assert r.plan.fa.skip_kv_cache and not [a for a in r.adjustments if a.field == "is_embedding"]
    # SGLang validates --prefill-only-disable-kv-cache before it turns embedding mode on: still refused without the flag
    with pytest.raises(PlanError) as err:
        resolve(ServerArgs(**fast_path, prefill_only_disable_kv_cache=True), model("all-MiniLM-L6-v2"), fa3_gpu())
    assert "prefill-only-kv.needs-embedding" in {v.rule for v in err.value.violations}


def test_embedding_gemma_is_served_as_a_full_encoder():
    """R33: EmbeddingGemma becomes an embedding server without radix cache or chunked prefill (the FA fast path's
    preconditions); on SM90/SM100 with an FA or unset prefill backend, without a KV pool. Its layers are not causal
    and its sliding-window layers keep their window, which FlashInfer cannot bound after a query: refused."""
    from tests.support.helpers import embedding_gemma

    r = resolve(ServerArgs(), embedding_gemma(), Platform.from_name("sm90"))
    a = r.server_args
    assert (a.is_embedding, a.disable_radix_cache, a.chunked_prefill_size, a.prefill_only_disable_kv_cache) == (
        True,
        True,
        -1,
        True,
    )
    assert r.plan.prefill_backend == "fa3" and r.plan.fa.skip_kv_cache
    for kind in ("sliding_window", "full"):
        assert not r.plan.layer(kind).common.causal
    assert r.plan.layer("sliding_window").common.use_window
    r = resolve(ServerArgs(attention_backend="fa3"), embedding_gemma(), fa3_gpu("sm80"))  # no no-pool path on SM80
    assert r.server_args.is_embedding and not r.server_args.prefill_only_disable_kv_cache and r.plan.fa.skip_kv_cache
    r = resolve(
        ServerArgs(attention_backend="triton"), embedding_gemma(), Platform.from_name("sm90")
    )  # a non-FA backend keeps the pool
    assert r.server_args.is_embedding and not r.server_args.prefill_only_disable_kv_cache
    with pytest.raises(PlanError) as err:
        resolve(ServerArgs(attention_backend="flashinfer"), embedding_gemma(), Platform.from_name("sm90"))
    assert {v.rule for v in err.value.violations} == {"flashinfer.no-bidirectional-window"}
    # the causal Gemma 3 text model is untouched
    r = resolve(ServerArgs(), model("gemma-3-1b-it"), Platform.from_name("sm90"))
    assert not r.server_args.is_embedding and r.plan.layer("sliding_window").common.causal


def test_no_rule_can_combine_mla_with_skip_kv_cache(rules):
    enc = Encoder(rules)
    solver = z3.Solver()
    solver.add(*enc.axioms)
    use_mla, _ = enc.var("use_mla")
    setters = [r for r in rules.rules if r.sets.get("fa.skip_kv_cache") is True]
    assert setters
    for r in setters:
        assert solver.check(enc.encode(r.condition.tree.body), use_mla) == z3.unsat, r.id


@pytest.mark.parametrize("name", ["Llama-3.1-8B", "DeepSeek-V2-Lite"])
def test_precompute_scheduler_metadata_exhaustive(name):
    m = model(name)
    for dp, cp in itertools.product([False, True], [False, True]):
        args = ServerArgs(
            attention_backend="fa3",
            enable_dp_attention=dp,
            dp_size=2 if dp else 1,
            tp_size=2 if dp else 1,
            enable_prefill_cp=cp,
        )
        r = resolve(args, m, fa3_gpu())
        assert r.plan.fa.precompute_scheduler_metadata is not (dp or cp or m.use_mla)


def test_dp_attention_without_dp_size_is_switched_off_with_a_warning():
    r = resolve(ServerArgs(attention_backend="fa3", enable_dp_attention=True), model("Llama-3.1-8B"), fa3_gpu())
    assert r.plan.fa.precompute_scheduler_metadata and not r.server_args.enable_dp_attention
    assert any("dp-attention.needs-dp-size" in w for w in r.warnings)


@pytest.mark.parametrize(
    "gpu, backend, kernels, precompute",
    [
        ("sm90", "fa4", None, False),
        ("sm100", "fa4", None, False),
        ("sm120", "fa4", None, False),  # SGLang's FA4 pages on SM12x, with a runtime policy and no schedule
        ("sm90", "fa3", ("attngate",), False),  # flash_attn.cute serves both names
        ("sm90", "fa3", None, True),  # a stock SGLang install: sgl_kernel's FA3
        ("sm90", "fa3", ("flash_attn_interface",), True),
    ],
)
def test_fa4_takes_no_precomputed_schedule(gpu, backend, kernels, precompute):
    """fa.fa4-no-scheduler-precompute: SGLang 0.5.23 leaves FA4's get_scheduler_metadata unset on every architecture,
    so only FA3 precomputes one."""
    platform = Platform.from_name(gpu, kernels=kernels) if kernels else Platform.from_name(gpu)
    r = resolve(ServerArgs(attention_backend=backend), model("Llama-3.1-8B"), platform)
    assert r.plan.fa.precompute_scheduler_metadata is precompute


@pytest.mark.parametrize("page_size, refused", [(4096, False), (8192, False), (65536, True)])
def test_chunked_local_attention_on_fa_needs_pages_that_divide_the_chunk(page_size, refused):
    """fa.local-attention-chunk-a-multiple-of-page-size: Llama 4's chunks of 8192 over pages that do not divide them
    are refused at start-up on fa3 (SGLang's FA backend asserts it at the first batch; declared in
    sglang.kernel-limits-at-start-up); triton, SM80's default for Llama 4, is not held to it."""
    name, rule = "Llama-4-Scout-17B-16E-Instruct", "fa.local-attention-chunk-a-multiple-of-page-size"
    assert (rule in refusing_rules_of(lambda: resolve_flags(f"--page-size {page_size}", name, "sm90"))) == refused
    assert rule not in refusing_rules_of(lambda: resolve_flags(f"--page-size {page_size}", name, "sm80"))
