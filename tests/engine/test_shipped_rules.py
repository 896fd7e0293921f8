"""The shipped rules.yaml: the five required behaviours, exhaustively over the facts they name,
and every rule's truth table (the compiled condition against an independent z3 encoding)."""

from __future__ import annotations

import ast
import itertools
import json
import math
import random

import pytest
import z3

from attngate import (
    ForwardMode,
    LayerKind,
    ModelFacts,
    PlanError,
    Platform,
    ServerArgs,
    resolve,
)
from attngate.analysis.encoding import Encoder
from attngate.analysis.lint import lint_rules
from attngate.facts.catalogue import FACTS, base_facts
from attngate.plan.registry import GATES
from attngate.rules.condition import gate_key
from tests.support.helpers import MODELS, fa3_gpu, model, refusing_rules_of, resolve_flags

FA_GPU = {"fa3": "sm90", "fa4": "sm100", "flashinfer": "sm90"}
#: SGLang's FlashInfer backend gives the soft-cap and the ragged window per call, not at plan time (sglang issue 33915)
SGLANG_FLASHINFER_PLAN_TIME = [
    "known.flashinfer-softcap-planned-uncapped",
    "known.flashinfer-ragged-prefill-drops-window",
]


def test_shipped_rules_lint_clean_and_documented(rules):
    assert lint_rules(rules) == []
    assert len(rules.rules) >= 35
    for r in rules.rules:
        assert r.summary and r.why and r.source, r.id


# ---- 1. fa.skip_kv_cache ------------------------------------------------------------------------


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


# ---- 2. fa.precompute_scheduler_metadata --------------------------------------------------------


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
        ("sm90", "fa3", ("attngate",), False),  # flash_attn.cute serves both names
        ("sm90", "fa3", None, True),  # a stock SGLang install: sgl_kernel's FA3
        ("sm90", "fa3", ("flash_attn_interface",), True),
    ],
)
def test_fa4_takes_no_precomputed_schedule_outside_sm120(gpu, backend, kernels, precompute):
    """fa.fa4-no-scheduler-precompute: SGLang leaves FA4's get_scheduler_metadata unset except on SM120, where
    flash_attn.cute pages no KV cache (fa.cute-pages-on-sm90-and-sm100-only refuses it), so only FA3 precomputes one."""
    platform = Platform.from_name(gpu, kernels=kernels) if kernels else Platform.from_name(gpu)
    r = resolve(ServerArgs(attention_backend=backend), model("Llama-3.1-8B"), platform)
    assert r.plan.fa.precompute_scheduler_metadata is precompute


# ---- 3. deterministic inference -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["Llama-3.1-8B", "gemma-2-9b", "whisper-large-v3-turbo"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_flashinfer_every_wrapper_kind(name, deterministic):
    r = resolve(
        ServerArgs(attention_backend="flashinfer", enable_deterministic_inference=deterministic),
        model(name),
        Platform.from_name("sm90"),
        allow_known_failures=SGLANG_FLASHINFER_PLAN_TIME,  # gemma-2 on SGLang's FlashInfer (sglang issue 33915)
    )
    fi = r.plan.flashinfer
    assert (
        fi.wrapper_dispatch
        == {"Llama-3.1-8B": "single", "gemma-2-9b": "sliding_window", "whisper-large-v3-turbo": "cross_attention"}[name]
    )
    if deterministic:
        assert (fi.prefill_fixed_split_size, fi.decode_fixed_split_size) == (4096, 2048)
        assert fi.cuda_graph_disable_split_kv and fi.decode_use_tensor_cores and not fi.use_ragged_prefill
        assert r.server_args.sampling_backend == "pytorch"
    else:
        assert (fi.prefill_fixed_split_size, fi.decode_fixed_split_size, fi.cuda_graph_disable_split_kv) == (
            None,
            None,
            False,
        )
        assert fi.use_ragged_prefill is not m_is_multimodal(name)


def m_is_multimodal(name: str) -> bool:
    return model(name).is_multimodal


@pytest.mark.parametrize("backend, gpu", [("fa3", "sm90"), ("fa4", "sm100")])
def test_deterministic_fa_num_splits(backend, gpu):
    for det in (False, True):
        r = resolve(
            ServerArgs(attention_backend=backend, enable_deterministic_inference=det),
            model("Llama-3.1-8B"),
            fa3_gpu(gpu),
        )
        assert r.plan.fa.num_splits == (1 if det else 0)
    for backend, fa3_installed in (("fa4", True), ("fa3", False)):  # FA4's flash_attn.cute cannot split KV on SM90
        r = resolve(
            ServerArgs(attention_backend=backend),
            model("Llama-3.1-8B"),
            Platform.from_name("sm90", has_flash_attn_interface=fa3_installed),
        )
        assert r.plan.fa.num_splits == 1 and r.plan.fa.provider == "flash_attn.cute"
    r = resolve(ServerArgs(attention_backend="fa3"), model("Llama-3.1-8B"), fa3_gpu())
    assert r.plan.fa.provider == "flash_attn_interface"


def test_fa3_interface_never_serves_a_model_with_sinks():
    """Upstream flash_attn_interface has no learned sinks: gpt-oss on fa3 runs flash_attn.cute, with its limits."""
    for name in ("gpt-oss-20b", "Llama-3.1-8B"):
        for installed in (True, False):
            r = resolve(
                ServerArgs(attention_backend="fa3"),
                model(name),
                Platform.from_name("sm90", has_flash_attn_interface=installed),
            )
            interface = installed and not model(name).has_attention_sinks
            assert r.plan.fa.provider == ("flash_attn_interface" if interface else "flash_attn.cute")
            assert r.plan.fa.num_splits == (0 if interface else 1)


def test_deterministic_rejects_other_backends_and_defaults_by_arch():
    with pytest.raises(PlanError, match="support deterministic inference"):
        resolve(
            ServerArgs(attention_backend="torch_native", enable_deterministic_inference=True),
            model("Llama-3.1-8B"),
            Platform.from_name("sm90"),
        )
    for gpu, name, expected in [
        ("sm90", "Llama-3.1-8B", "fa3"),
        ("sm100", "Llama-3.1-8B", "flashinfer"),
        ("sm100", "DeepSeek-V2-Lite", "triton"),
    ]:
        r = resolve(ServerArgs(enable_deterministic_inference=True), model(name), Platform.from_name(gpu))
        assert r.plan.prefill_backend == expected


# ---- 4. wrapper dispatch and the per-layer window ------------------------------------------------


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.json")), ids=lambda p: p.stem)
def test_wrapper_dispatch_from_model_facts(path):
    m = model(path.stem)
    try:
        r = resolve(
            ServerArgs(attention_backend="flashinfer"),
            m,
            Platform.from_name("sm90"),
            allow_known_failures=SGLANG_FLASHINFER_PLAN_TIME,  # gemma: window and soft-cap (sglang issue 33915)
        )
    except PlanError:
        assert m.has_attention_sinks or m.model_type == "llama4" or m.head_dim not in (64, 128, 256)  # MiniLM: 32
        return
    expected = (
        "sliding_window"
        if (m.has_sliding_window or m.is_local_attention_model)
        else "cross_attention"
        if m.has_cross_attention
        else "single"
    )
    assert r.plan.flashinfer.wrapper_dispatch == expected
    assert r.plan.layer("sliding_window").common.use_window and not r.plan.layer("full").common.use_window
    full_index = r.plan.layer("full").flashinfer.wrapper_index
    assert full_index == (1 if expected == "sliding_window" else 0)
    assert r.plan.layer("cross_attention").flashinfer.wrapper_index == (1 if expected == "cross_attention" else 0)


def test_ragged_extend_pages_only_the_prefix():
    r = resolve(ServerArgs(attention_backend="flashinfer"), model("Mistral-7B-v0.1"), Platform.from_name("sm90"))
    assert r.plan.mode("extend").flashinfer.paged_kv_extent == "prefix"
    assert r.plan.mode("decode").flashinfer.paged_kv_extent == "prefix_plus_new"


# ---- 5. DRAFT_EXTEND_V2 -------------------------------------------------------------------------


@pytest.mark.parametrize("backend, gpu", [("fa3", "sm90"), ("fa4", "sm100")])
@pytest.mark.parametrize("cuda_graph", [True, False])
def test_draft_extend_v2_reads_prefix_plus_new(backend, gpu, cuda_graph):
    args = ServerArgs(
        attention_backend=backend,
        speculative_algorithm="EAGLE",
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        disable_cuda_graph=not cuda_graph,
    )
    r = resolve(args, model("Llama-3.1-8B"), Platform.from_name(gpu))
    de = r.plan.mode("draft_extend_v2")
    assert de.fa.kv_extent == "prefix_plus_new"
    assert de.common.capture_cuda_graph is cuda_graph  # replay reads the same kv_extent as eager
    assert r.explanation.modes["draft_extend_v2"]["fa.kv_extent"].origin == "fa.draft-extend-v2-reads-prefix-plus-new"
    assert r.plan.mode("idle").fa.kv_extent == "none"


# ---- other shipped rules, end to end -------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, name, gpu, check",
    [
        ("", "Llama-3.1-8B", "sm90", lambda r: r.plan.prefill_backend == "fa3" and r.server_args.page_size == 1),
        (
            "",
            "Llama-3.1-8B",
            "sm100",
            lambda r: r.plan.prefill_backend == "trtllm_mha" and r.server_args.page_size == 64,
        ),
        ("", "Llama-3.1-8B", "sm80", lambda r: r.plan.prefill_backend == "flashinfer"),
        ("", "DeepSeek-V2-Lite", "sm100", lambda r: r.plan.prefill_backend == "flashinfer"),
        (
            "",
            "DeepSeek-V3",
            "sm100",
            lambda r: r.plan.prefill_backend == "trtllm_mla" and r.server_args.page_size == 64,
        ),
        (
            "--decode-attention-backend flashinfer",
            "DeepSeek-V3",
            "sm100",  # R62 needs all three flags unset; R6 then picks
            lambda r: (r.plan.prefill_backend, r.plan.decode_backend) == ("flashinfer", "flashinfer"),
        ),
        ("", "gpt-oss-20b", "sm80", lambda r: r.plan.prefill_backend == "triton"),
        (
            "",
            "gpt-oss-20b",
            "sm100",  # 0.5.23's trtllm_mha translates full->SWA page tables: the hybrid pool stays on
            lambda r: r.plan.prefill_backend == "trtllm_mha" and not r.server_args.disable_hybrid_swa_memory,
        ),
        (
            "",
            "Llama-3.2-11B-Vision-Instruct",
            "sm90",
            lambda r: r.server_args.chunked_prefill_size == -1,
        ),  # Mllama: one chunk
        ("--chunked-prefill-size 4096", "Qwen3-8B", "sm90", lambda r: r.server_args.chunked_prefill_size == 4096),
        (
            "",
            "whisper-large-v3-turbo",
            "sm90",
            lambda r: r.plan.prefill_backend == "flashinfer" and r.server_args.disable_radix_cache,
        ),
        (
            "--speculative-algorithm EAGLE",
            "Llama-3.1-8B",
            "sm90",  # issue 36554: topk filled first, then the backend
            lambda r: r.server_args.speculative_eagle_topk == 4 and r.plan.prefill_backend == "flashinfer",
        ),
        (
            "--speculative-algorithm NEXTN",
            "DeepSeek-V3",
            "sm90",
            lambda r: r.server_args.speculative_algorithm == "EAGLE" and r.plan.prefill_backend == "fa3",
        ),
        (
            "--attention-backend fa3 --kv-cache-dtype fp8_e5m2",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.plan.prefill_backend == "triton" and any("fa3.fp8-e5m2" in w for w in r.warnings),
        ),
        (
            "--attention-backend torch_native",
            "Llama-3.1-8B",
            "sm90",
            lambda r: not r.plan.common.cuda_graph and not r.plan.mode("decode").common.capture_cuda_graph,
        ),
        ("--attention-backend fa4", "Llama-3.1-8B", "sm100", lambda r: r.plan.common.page_size == 128),
        (
            "--enable-hierarchical-cache --attention-backend fa3",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.plan.decode_backend == "flashinfer",
        ),
        (
            "--enable-hierarchical-cache --decode-attention-backend fa3 --attention-backend fa3",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.server_args.hicache_io_backend == "direct" and r.plan.decode_backend == "fa3",
        ),
        (
            "--attention-backend flashinfer --kv-cache-dtype fp8_e4m3",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.plan.flashinfer.decode_use_tensor_cores,
        ),
        (
            "--attention-backend flashinfer",
            "gemma-2-9b",
            "sm90",
            lambda r: not r.plan.flashinfer.decode_use_tensor_cores and r.server_args.disable_hybrid_swa_memory,
        ),
        (
            "--attention-backend flashinfer",
            "gemma-3-1b-it",
            "sm90",
            lambda r: r.plan.flashinfer.decode_use_tensor_cores,
        ),  # MQA: group of 4
        (
            "--attention-backend fa4 --speculative-algorithm EAGLE",
            "Llama-3.1-8B",
            "sm100",  # topk 4 exempts FA4 from 128-token pages
            lambda r: (
                r.server_args.speculative_eagle_topk == 4
                and r.plan.common.page_size == 1
                and "known failure known.fa-eagle-tree-verify-drift allowed" in " ".join(r.warnings)
            ),
        ),
        ("--attention-backend flashinfer", "Qwen3-8B", "sm90", lambda r: r.plan.flashinfer.workspace_size_mb == 512),
        ("--attention-backend fa3", "DeepSeek-V2-Lite", "sm90", lambda r: r.plan.common.mla_chunked_prefix_cache),
        (
            "--attention-backend triton",
            "DeepSeek-V2-Lite",
            "sm90",
            lambda r: not r.plan.common.mla_chunked_prefix_cache,
        ),
        (
            "--rl-on-policy-target fsdp",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.server_args.enable_deterministic_inference and r.plan.fa.num_splits == 1,
        ),
        (
            "--disaggregation-mode decode",
            "Llama-3.1-8B",
            "sm90",  # R55: chunk cache on the decode server, with a warning
            lambda r: r.server_args.disable_radix_cache and any("pd.decode-role-chunk-cache" in w for w in r.warnings),
        ),
        (
            "--disaggregation-mode prefill",
            "Llama-3.1-8B",
            "sm90",  # R56: the prefill server replays no decode graph
            lambda r: (
                not r.plan.common.cuda_graph and not any(r.plan.mode(m).common.capture_cuda_graph for m in ForwardMode)
            ),
        ),
        (
            "--disaggregation-mode null",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.plan.common.cuda_graph and not r.server_args.disable_radix_cache,
        ),
        ("--enable-unified-memory", "Llama-3.1-8B", "sm90", lambda r: r.plan.prefill_backend == "fa3"),
        (
            "--speculative-algorithm DFLASH",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.server_args.max_running_requests == 48,
        ),  # R41
        (
            "--speculative-algorithm EAGLE --max-running-requests 8",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.server_args.max_running_requests == 8,
        ),
        ("", "Llama-3.1-8B", "sm90", lambda r: r.server_args.max_running_requests is None),
        (
            "--enable-dp-lm-head --enable-dp-attention",
            "Llama-3.1-8B",
            "sm90",  # dp_size 1: both off (R36)
            lambda r: not r.server_args.enable_dp_attention and not r.server_args.enable_dp_lm_head,
        ),
        (
            "--speculative-algorithm NEXTN --speculative-use-rejection-sampling",
            "DeepSeek-V3",
            "sm90",  # NEXTN -> EAGLE, chain (3, 1, 4)
            lambda r: r.server_args.speculative_eagle_topk == 1,
        ),
        (
            "--enable-unified-memory --attention-backend trtllm_mla",
            "DeepSeek-V3",
            "sm100",
            lambda r: r.plan.decode_backend == "trtllm_mla",
        ),
        (
            "--speculative-algorithm NGRAM",
            "Llama-3.1-8B",
            "sm100",
            lambda r: r.plan.prefill_backend == "flashinfer",
        ),  # R3: no topk given
        (
            "--speculative-algorithm NGRAM",
            "Llama-3.1-8B",
            "sm90",  # R49: breadth 10, 12 draft tokens, 12 // 10 steps
            lambda r: (
                (
                    r.server_args.speculative_eagle_topk,
                    r.server_args.speculative_num_draft_tokens,
                    r.server_args.speculative_num_steps,
                )
                == (10, 12, 1)
                and r.plan.prefill_backend == "fa3"
            ),
        ),
        (
            "--speculative-algorithm NGRAM --speculative-ngram-max-bfs-breadth 4 --speculative-num-draft-tokens 8 --enable-mixed-chunk",
            "Llama-3.1-8B",
            "sm90",
            lambda r: (
                (r.server_args.speculative_eagle_topk, r.server_args.speculative_num_steps) == (4, 2)
                and not r.server_args.enable_mixed_chunk
            ),
        ),
        # found by attngate conform against SGLang 0.5.23:
        (
            "--speculative-algorithm EAGLE --enable-mixed-chunk",
            "Qwen3-8B",
            "sm90",
            lambda r: r.server_args.enable_mixed_chunk,
        ),
        (
            "--speculative-algorithm STANDALONE --enable-mixed-chunk",
            "Qwen3-8B",
            "sm90",
            lambda r: not r.server_args.enable_mixed_chunk,
        ),
        (
            "--prefill-attention-backend triton --decode-attention-backend triton",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.server_args.attention_backend == "triton",
        ),
        (
            "--kv-cache-dtype nvfp4",
            "Qwen3-8B",
            "sm100",
            lambda r: (r.plan.prefill_backend, r.plan.decode_backend) == ("trtllm_mha",) * 2,
        ),
        (
            "--kv-cache-dtype nvfp4 --attention-backend flashinfer",
            "Qwen3-8B",
            "sm100",
            lambda r: (r.plan.prefill_backend, r.plan.decode_backend) == ("flashinfer", "trtllm_mha"),
        ),
        (
            "--kv-cache-dtype nvfp4 --speculative-algorithm EAGLE",
            "Qwen3-8B",
            "sm100",
            lambda r: r.server_args.speculative_draft_attention_backend == "trtllm_mha",
        ),
        ("--disaggregation-mode prefill", "Qwen3-8B", "sm90", lambda r: r.server_args.disable_cuda_graph),
        (
            "--kv-cache-dtype nvfp4 --prefill-attention-backend flashinfer",
            "Qwen3-8B",
            "sm100",
            lambda r: r.server_args.decode_attention_backend == "trtllm_mha",
        ),
        (
            "--enable-hierarchical-cache",
            "gpt-oss-20b",
            "sm90",  # attention sinks: the FA3 decode moves to triton
            lambda r: (r.plan.prefill_backend, r.plan.decode_backend) == ("fa3", "triton"),
        ),
        (
            "--speculative-algorithm NGRAM --attention-backend flashinfer --page-size 16",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.plan.common.page_size == 16,
        ),
        (
            "--speculative-algorithm DFLASH --speculative-num-steps 4 --speculative-eagle-topk 2",
            "Llama-3.1-8B",
            "sm90",
            lambda r: (r.server_args.speculative_num_steps, r.server_args.speculative_eagle_topk) == (1, 1),
        ),
        (
            "--speculative-algorithm DFLASH",
            "Llama-3.1-8B",
            "sm100",
            lambda r: r.plan.prefill_backend == "trtllm_mha",
        ),  # forces topk 1
        (
            "--speculative-algorithm STANDALONE",
            "Llama-3.1-8B",
            "sm100",  # its (3, 1, 4) is filled before the default backend
            lambda r: r.plan.prefill_backend == "trtllm_mha",
        ),
        (
            "--speculative-algorithm STANDALONE",
            "Llama-3.1-8B",
            "sm90",  # R45: a chain, where EAGLE on Llama picks a tree
            lambda r: (
                (
                    r.server_args.speculative_num_steps,
                    r.server_args.speculative_eagle_topk,
                    r.server_args.speculative_num_draft_tokens,
                )
                == (3, 1, 4)
            ),
        ),
        (
            "--kv-cache-dtype fp4_mx_block16 --attention-backend triton",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.plan.prefill_backend == "triton",
        ),
        (
            "--kv-cache-dtype fp4_mx_block16 --prefill-attention-backend fa4 --decode-attention-backend triton --attention-backend fa4",
            "Llama-3.1-8B",
            "sm100",
            lambda r: r.plan.decode_backend == "triton",
        ),
        (
            "--kv-cache-dtype fp4_mx_block16 --prefill-attention-backend flashinfer --decode-attention-backend triton",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.plan.prefill_backend == "flashinfer",
        ),  # two backends, neither FA4: SGLang only warns
        (
            "--enable-dp-attention --dp-size 2 --tp-size 4",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.plan.common.attn_tp_size == 2,
        ),
        (
            "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 8",
            "Llama-3.1-8B",
            "sm90",
            lambda r: (
                r.server_args.speculative_num_draft_tokens == 4  # R47: a chain drafts steps + 1
                and any("spec.chain-draft-tokens" in w for w in r.warnings)
            ),
        ),
        (
            "--speculative-algorithm EAGLE --speculative-num-steps 5 --speculative-eagle-topk 1",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.server_args.speculative_num_draft_tokens == 6,
        ),
        (
            "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 2 --speculative-num-draft-tokens 8",
            "Llama-3.1-8B",
            "sm90",
            lambda r: r.server_args.speculative_num_draft_tokens == 8,
        ),  # a tree keeps its count
        ("--attention-backend hpc_ops", "Llama-3.1-8B", "sm90", lambda r: r.server_args.page_size == 64),
        (
            "--prefill-attention-backend flashinfer --decode-attention-backend fa3 --page-size 16 --speculative-algorithm EAGLE "
            "--speculative-eagle-topk 4 --speculative-num-steps 3 --speculative-num-draft-tokens 8",
            "gemma-2-9b",
            "sm90",
            lambda r: r.plan.prefill_backend == "flashinfer",
        ),  # the tree verify runs on the prefill backend, FlashInfer
    ],
)
def test_rule_outcomes(flags, name, gpu, check):
    r = resolve(
        ServerArgs.from_flags(flags.split()),
        model(name),
        fa3_gpu(gpu),  # SGLang's hosts have FA3
        allow_known_failures=["known.fa-eagle-tree-verify-drift", *SGLANG_FLASHINFER_PLAN_TIME],
    )  # SGLang resolves it; attngate asks for the opt-in
    assert check(r), r.plan


@pytest.mark.parametrize(
    "flags, name, gpu, rule",
    [
        ("--attention-backend fa3", "Llama-3.1-8B", "sm100", "fa3.requires-sm80-or-sm90"),
        ("--attention-backend fa3", "DeepSeek-V2-Lite", "sm80", "fa3.requires-sm80-or-sm90"),
        ("--attention-backend fa4", "DeepSeek-V2-Lite", "sm90", "fa.mla-needs-absorbed-kernel"),
        ("--attention-backend triton", "whisper-large-v3-turbo", "sm90", "triton.no-encoder-decoder"),
        ("--attention-backend flashinfer", "gpt-oss-20b", "sm90", "flashinfer.no-attention-sinks"),
        ("--attention-backend trtllm_mha", "DeepSeek-V2-Lite", "sm100", "trtllm-mha.mha-only"),
        ("--attention-backend trtllm_mla", "Llama-3.1-8B", "sm100", "mla-backends.mla-only"),
        ("--attention-backend trtllm_mla", "DeepSeek-V2-Lite", "sm90", "trtllm-mla.blackwell-only"),
        (
            "--attention-backend flex_attention --speculative-algorithm EAGLE",
            "Llama-3.1-8B",
            "sm90",
            "flex-attention.no-speculative",
        ),
        (
            "--prefill-attention-backend fa3 --attention-backend triton --kv-cache-dtype fp8_e5m2",
            "Llama-3.1-8B",
            "sm90",
            "fa3.fp8-e5m2-kv-explicit-phase",
        ),
        ("--enable-hierarchical-cache --disable-radix-cache", "Llama-3.1-8B", "sm90", "hicache.needs-radix-cache"),
        (
            "--attention-backend trtllm_mha --speculative-algorithm EAGLE --speculative-eagle-topk 4 --speculative-num-steps 3 --speculative-num-draft-tokens 8",
            "Llama-3.1-8B",
            "sm100",
            "spec.trtllm-mha-topk-one",
        ),
        (
            "--attention-backend flashinfer --speculative-algorithm EAGLE --speculative-eagle-topk 2 --speculative-num-steps 3 --speculative-num-draft-tokens 4",
            "DeepSeek-V2-Lite",
            "sm90",
            "flashinfer.mla-topk-one",
        ),
        (
            "--attention-backend flashinfer --speculative-algorithm STANDALONE --enable-dp-attention --dp-size 2",
            "Llama-3.1-8B",
            "sm90",
            "spec.standalone-no-dp-attention",
        ),
        ("--kv-cache-dtype nvfp4", "Llama-3.1-8B", "sm90", "kv-dtype.nvfp4-blackwell"),
        ("--attention-backend flashinfer", "Llama-4-Scout-17B-16E-Instruct", "sm90", "llama4.backends"),
        (
            "--enable-deterministic-inference --attention-backend flashinfer",
            "DeepSeek-V2-Lite",
            "sm90",
            "deterministic.deepseek-backend",
        ),
        (
            "--prefill-attention-backend fa4 --decode-attention-backend flashmla --attention-backend fa4",
            "Llama-3.1-8B",
            "sm100",
            "page-size.incompatible-backends",
        ),
        (
            "--kv-cache-dtype fp4_mx_block16",
            "Llama-3.1-8B",
            "sm90",
            "kv4.backends",
        ),  # the default fa3 reads no FP4 pages
        ("--kv-cache-dtype fp4_mx_block16 --attention-backend flashinfer", "Llama-3.1-8B", "sm90", "kv4.backends"),
        (
            "--kv-cache-dtype fp4_mx_block16 --attention-backend triton",
            "DeepSeek-V2-Lite",
            "sm90",
            "kv4.backends",
        ),  # MLA: its own list
        (
            "--kv-cache-dtype fp4_mx_block16 --prefill-attention-backend fa4 --decode-attention-backend flashinfer --attention-backend fa4",
            "Llama-3.1-8B",
            "sm100",
            "kv4.fa4-prefill-decode-backend",
        ),
        ("--enable-dp-attention --dp-size 2 --tp-size 3", "Llama-3.1-8B", "sm90", "dp-attention.tp-divisible-by-dp"),
        ("--enable-unified-memory --attention-backend torch_native", "Llama-3.1-8B", "sm90", "unified-memory.backends"),
        (
            "--enable-dp-lm-head --dp-size 2 --tp-size 2",
            "Llama-3.1-8B",
            "sm90",
            "dp-attention.lm-head-needs-dp-attention",
        ),
        (
            "--speculative-algorithm EAGLE --speculative-use-rejection-sampling",
            "Llama-3.1-8B",
            "sm90",
            "spec.rejection-sampling-eagle-chain",
        ),  # Llama's EAGLE default is a tree (topk 4)
        (
            "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "
            "--speculative-use-rejection-sampling --speculative-accept-threshold-single 0.5",
            "Llama-3.1-8B",
            "sm90",
            "spec.rejection-sampling-eagle-chain",
        ),
        (
            "--speculative-algorithm NGRAM --speculative-use-rejection-sampling",
            "Llama-3.1-8B",
            "sm90",
            "spec.rejection-sampling-eagle-chain",
        ),
        (
            "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 0 --speculative-num-draft-tokens 4",
            "Llama-3.1-8B",
            "sm90",
            "spec.eagle-topk-at-least-one",
        ),
        (
            "--enable-unified-memory --attention-backend fa4",
            "DeepSeek-V2-Lite",
            "sm100",
            "unified-memory.backends",
        ),  # MLA list
        (
            "--enable-unified-memory",
            "Llama-4-Scout-17B-16E-Instruct",
            "sm90",
            "unified-memory.no-local-attention-on-fa",
        ),
        (
            "--speculative-algorithm NGRAM --enable-dp-attention --dp-size 2 --tp-size 2",
            "Llama-3.1-8B",
            "sm90",
            "spec.ngram-no-dp-attention",
        ),
        (
            "--disaggregation-mode decode --enable-hierarchical-cache",
            "Llama-3.1-8B",
            "sm90",
            "hicache.needs-radix-cache",
        ),  # after R55
        (
            "--attention-backend flashmla --speculative-algorithm EAGLE --speculative-eagle-topk 2 --speculative-num-steps 3 "
            "--speculative-num-draft-tokens 4",
            "DeepSeek-V2-Lite",
            "sm90",
            "mla-backends.topk-one",
        ),
        (
            "--speculative-algorithm NGRAM --page-size 16",
            "Llama-3.1-8B",
            "sm90",
            "spec.ngram-page-tree-flashinfer-only",
        ),
        (
            "--speculative-algorithm NGRAM --speculative-num-draft-tokens 4096 --speculative-ngram-max-bfs-breadth 1",
            "Llama-3.1-8B",
            "sm90",
            "spec.ngram-steps-from-draft-tokens",
        ),  # 4096 steps, past speculative_num_steps' bound: refused, not a traceback
        (
            "--speculative-algorithm NGRAM --speculative-eagle-topk 1",
            "Llama-3.1-8B",
            "sm100",
            "spec.trtllm-mha-topk-one",
        ),  # breadth 10
        (
            "--speculative-algorithm DFLASH --enable-dp-attention --dp-size 2 --tp-size 2",
            "Llama-3.1-8B",
            "sm90",
            "spec.dflash-no-dp-attention",
        ),
        ("--speculative-algorithm EAGLE --speculative-eagle-topk 1", "Llama-3.1-8B", "sm90", "spec.params-all-or-none"),
        (
            "--speculative-algorithm NEXTN --speculative-num-draft-tokens 4",
            "DeepSeek-V3",
            "sm90",
            "spec.params-all-or-none",
        ),
        ("--attention-backend hpc_ops", "whisper-large-v3-turbo", "sm90", "hpc-ops.mha-decoder-only-no-speculation"),
        (
            "--attention-backend hpc_ops --speculative-algorithm EAGLE",
            "Llama-3.1-8B",
            "sm90",
            "hpc-ops.mha-decoder-only-no-speculation",
        ),
        (
            "--attention-backend fa3 --page-size 16 --speculative-algorithm EAGLE --speculative-eagle-topk 4 --speculative-num-steps 3 "
            "--speculative-num-draft-tokens 8",
            "gemma-2-9b",
            "sm90",
            "fa.tree-verify-window-needs-page-1",
        ),
        (
            "--prefill-attention-backend flashinfer --decode-attention-backend fa3 --speculative-attention-mode decode --page-size 16 "
            "--speculative-algorithm EAGLE --speculative-eagle-topk 4 --speculative-num-steps 3 --speculative-num-draft-tokens 8",
            "gemma-2-9b",
            "sm90",
            "fa.tree-verify-window-needs-page-1",
        ),  # verify runs on the decode backend
    ],
)
def test_rule_rejections(flags, name, gpu, rule):
    assert rule in refusing_rules_of(
        lambda: resolve(ServerArgs.from_flags(flags.split()), model(name), Platform.from_name(gpu))
    )  # refused, or its default backend refused


# ---- every rule's truth table --------------------------------------------------------------------


def _domain(name: str, literals: set) -> list:
    t = (
        (GATES[name].type if name in GATES else FACTS[name].type)
        if name not in ("forward_mode", "layer_kind")
        else None
    )
    if t is None:
        from attngate.facts.catalogue import LAYER_FACT, MODE_FACT

        t = MODE_FACT.type if name == "forward_mode" else LAYER_FACT.type
    values: list = []
    if t.base == "bool":
        values = [False, True]
    elif t.choices and len(t.choices) <= 6:
        values = list(t.choices)
    elif t.choices:
        values = [v for v in t.choices if v in literals] + [next(v for v in t.choices if v not in literals)]
    elif t.base == "int":
        values = sorted({x + d for x in literals if isinstance(x, int) for d in (-1, 0, 1)} | {0})
    elif t.base == "float":
        values = sorted(
            {float(x) + d for x in literals if isinstance(x, (int, float)) for d in (-0.5, 0.0, 0.5)} | {0.0}
        )
    else:
        values = [v for v in literals if isinstance(v, str)] + ["<other>"]
    return values + ([None] if t.optional else [])


def _reads(node: ast.AST, predicates: dict) -> tuple[set[str], set]:
    names, literals = set(), set()
    groups = {id(a.value) for a in ast.walk(node) if isinstance(a, ast.Attribute)}
    for sub in ast.walk(node):
        if id(sub) in groups:
            continue
        if isinstance(sub, ast.Name) and sub.id in predicates:
            read_names, read_literals = _reads(predicates[sub.id], predicates)
            names |= read_names
            literals |= read_literals
        elif isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(f"{sub.value.id}.{sub.attr}")
        elif isinstance(sub, ast.Constant) and not isinstance(sub.value, bool):
            literals.add(sub.value)
        elif isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.USub) and isinstance(sub.operand, ast.Constant):
            literals.add(-sub.operand.value)
    return names, literals


def test_every_rule_truth_table_matches_an_independent_encoding(rules):
    """The compiled Python condition and the z3 encoding agree on every (sampled) assignment."""
    enc = Encoder(rules)
    predicates = {p.name: p.condition.tree.body for p in rules.predicates}
    base = rules.with_predicates(
        base_facts(ServerArgs(attention_backend="fa3"), model("Llama-3.1-8B"), Platform.from_name("sm90"))
    )
    rng = random.Random(0)
    checked = 0
    for rule in rules.rules:
        names, literals = _reads(rule.condition.tree.body, predicates)
        domains = {n: _domain(n, literals) for n in sorted(names)}
        if math.prod(len(d) for d in domains.values()) <= 4096:
            combos = list(itertools.product(*domains.values()))
            rng.shuffle(combos)
        else:  # too many to list: sample each fact independently
            combos = [tuple(rng.choice(d) for d in domains.values()) for _ in range(48)]
        formula = enc.encode(rule.condition.tree.body)
        seen = {True: 0, False: 0}
        for combo in combos[:48]:
            assignment = dict(zip(domains, combo))
            facts = dict(base)
            for n, v in assignment.items():
                facts[gate_key(n) if "." in n else n] = v
            facts = rules.with_predicates(facts)
            try:
                py = rule.matches(facts)
            except Exception:
                continue
            solver = z3.Solver()
            for n, v in assignment.items():
                value, none = enc.var(n)
                solver.add(none if v is None else z3.And(z3.Not(none), value == _z3(v)))
            assert solver.check(formula if py else z3.Not(formula)) == z3.sat, (rule.id, assignment)
            seen[py] += 1
            checked += 1
        assert seen[True] or seen[False], rule.id
    assert checked > 1000


def _z3(v):
    if isinstance(v, bool):
        return z3.BoolVal(v)
    if isinstance(v, int):
        return z3.IntVal(v)
    if isinstance(v, float):
        return z3.RealVal(v)
    return z3.StringVal(v)


@pytest.mark.parametrize("backend", ["fa3", "flashinfer"])
@pytest.mark.parametrize("det", [False, True])
def test_encoder_only_layers_write_the_cache_exactly_where_a_backend_reads_it(backend, det):
    """FA and ragged FlashInfer attend on the raw K/V of encoder-only layers; FlashInfer without
    ragged prefill (deterministic inference) reads them back through the paged wrapper."""
    r = resolve(
        ServerArgs(attention_backend=backend, enable_deterministic_inference=det, is_embedding=True),
        model("gte-Qwen2-7B-instruct"),
        fa3_gpu(),
    )
    paged_extend = (
        backend == "flashinfer" and r.plan.mode(ForwardMode.EXTEND).flashinfer.paged_kv_extent == "prefix_plus_new"
    )
    assert paged_extend is (backend == "flashinfer" and det)
    assert r.plan.layer(LayerKind.ENCODER_ONLY).common.write_kv_cache is paged_extend
    assert r.plan.layer(LayerKind.ENCODER_ONLY).common.causal is False


@pytest.mark.parametrize(
    "name, gpu, args, family",
    [
        ("Llama-3.1-8B", "sm90", {}, "fa3"),
        ("Llama-3.1-8B", "sm80", {}, "fa2"),
        ("Llama-3.1-8B", "sm100", {}, "fa2"),
        ("Llama-3.1-8B", "sm90", {"enable_deterministic_inference": True}, "fa3"),  # fixed splits on fa3
        ("Mistral-7B-v0.1", "sm90", {}, "fa2"),  # the window's paged half under ragged prefill takes a custom mask
        ("Mistral-7B-v0.1", "sm90", {"enable_deterministic_inference": True}, "fa3"),  # no ragged: window_left only
        ("whisper-large-v3-turbo", "sm90", {}, "fa3"),  # head dim 64, non-causal cross attention
        ("DeepSeek-V2-Lite", "sm90", {}, "fa3"),  # MLA non-absorbed prefill, 192/128
        (
            "Llama-3.1-8B",
            "sm90",
            {
                "speculative_algorithm": "EAGLE",
                "speculative_eagle_topk": 4,
                "speculative_num_steps": 3,
                "speculative_num_draft_tokens": 8,
            },
            "fa2",
        ),  # tree masks
    ],
)
def test_flashinfer_prefill_kernel_family(name, gpu, args, family):
    plan = resolve(ServerArgs(attention_backend="flashinfer", **args), model(name), Platform.from_name(gpu)).plan
    assert plan.flashinfer.prefill_kernel_family == family


# ---- known failures -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, name, entry",
    [
        ("--attention-backend fa3 --speculative-algorithm EAGLE", "Llama-3.1-8B", "known.fa-eagle-tree-verify-drift"),
        (
            "--attention-backend flashinfer --speculative-algorithm NGRAM",
            "DeepSeek-V2-Lite",
            "known.flashinfer-mla-non-eagle-verify",
        ),
        (
            "--attention-backend flashinfer --speculative-algorithm NGRAM",
            "Mistral-7B-v0.1",
            "known.flashinfer-swa-non-eagle-verify",
        ),
    ],
)
def test_a_known_failure_is_refused_naming_its_entry_unless_allowed(flags, name, entry):
    args = ServerArgs.from_flags(flags.split())
    with pytest.raises(PlanError) as err:
        resolve(args, model(name), Platform.from_name("sm90"))
    (v,) = [v for v in err.value.violations if v.kind == "known_failure"]
    assert v.rule == entry and v.issue.startswith("https://github.com/sgl-project/sglang/")
    r = resolve(args, model(name), Platform.from_name("sm90"), allow_known_failures=[entry])
    assert any(w.startswith(f"known failure {entry} allowed") for w in r.warnings)
    with pytest.raises(PlanError, match="did you mean"):
        resolve(args, model(name), Platform.from_name("sm90"), allow_known_failures=[entry + "x"])


@pytest.mark.parametrize("name, backend", [("Llama-3.1-8B", "triton"), ("gpt-oss-20b", "triton")])
def test_default_backend_without_flashinfer_installed_is_triton(name, backend):
    """R5: the generic MHA default is flashinfer only where FlashInfer imports, else triton (as for sinks)."""
    r = resolve(ServerArgs(), model(name), Platform.from_name("sm80", has_flashinfer=False))
    assert r.plan.prefill_backend == backend
    assert resolve(ServerArgs(), model("Llama-3.1-8B"), Platform.from_name("sm80")).plan.prefill_backend == "flashinfer"


# ---- model overrides of architectures outside examples/models (R66 to R70) ----------------------------


def _as_architecture(architecture: str, model_type: str, **config) -> ModelFacts:
    """Llama-3.1-8B's attention under another architecture's name, with the layer layout its Hub config gives."""
    raw = json.loads((MODELS / "Llama-3.1-8B.json").read_text())
    raw.update(architectures=[architecture], model_type=model_type, **config)
    return ModelFacts.from_hf_dict(raw)


OLMO3 = dict(
    sliding_window=4096,
    layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"] * 25,
)
QWEN3_NEXT = dict(
    layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"] * 25
)
LFM2 = dict(layer_types=["conv", "conv", "full_attention"] + ["conv"] * 29)
EXAONE4 = dict(sliding_window=4096, sliding_window_pattern="LLLG")


@pytest.mark.parametrize(
    "flags, arch, gpu, backend, hybrid_pool_off",
    [
        ("", ("Olmo2ForCausalLM", "olmo2"), "sm90", "fa3", True),
        ("", ("Olmo2ForCausalLM", "olmo2"), "sm80", "fa3", True),  # FA3 from SM80 up, never FlashInfer
        ("", ("Olmo2ForCausalLM", "olmo2"), "sm100", "trtllm_mha", True),
        (
            "",
            ("Olmo3ForCausalLM", "olmo3", OLMO3),
            "sm90",
            "fa3",
            True,
        ),  # 0.5.23: one pool for Olmo 3's window/full mix too
        ("--attention-backend triton", ("Olmo2ForCausalLM", "olmo2"), "sm90", "triton", True),
        ("", ("Gemma4ForCausalLM", "gemma4_text"), "sm90", "triton", False),
        ("", ("Gemma4ForConditionalGeneration", "gemma4"), "sm100", "trtllm_mha", False),
        ("--attention-backend fa4", ("Gemma4ForCausalLM", "gemma4_text"), "sm100", "fa4", False),
        ("", ("Exaone4ForCausalLM", "exaone4", EXAONE4), "sm90", "fa3", True),
        ("", ("Exaone4ForCausalLM", "exaone4"), "sm80", "flashinfer", False),  # no window layers: no constraint
        (
            "",
            ("NemotronHForCausalLM", "nemotron_h", {"hybrid_override_pattern": "M-M*" * 8}),
            "sm100",
            "flashinfer",
            False,
        ),
        ("", ("Lfm2ForCausalLM", "lfm2", LFM2), "sm90", "fa3", False),  # off SM100: the generic default
        ("", ("FalconH1ForCausalLM", "falcon_h1"), "sm100", "triton", False),
        (
            "",
            ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT),
            "sm100",
            "triton",
            False,
        ),  # radix cache on, no speculation
        ("--disable-radix-cache", ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT), "sm100", "trtllm_mha", False),
        ("", ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT), "sm90", "fa3", False),
        (
            "--attention-backend trtllm_mha",
            ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT),
            "sm100",
            "trtllm_mha",
            False,
        ),
    ],
)
def test_model_override_defaults(flags, arch, gpu, backend, hybrid_pool_off):
    r = resolve(
        ServerArgs.from_flags(flags.split()),
        _as_architecture(*arch[:2], **(arch[2] if len(arch) > 2 else {})),
        fa3_gpu(gpu),
    )
    assert (r.plan.prefill_backend, r.server_args.disable_hybrid_swa_memory) == (backend, hybrid_pool_off)
    if backend == "trtllm_mha":
        assert r.server_args.page_size == 64


@pytest.mark.parametrize(
    "flags, arch, gpu, rule",
    [
        ("--attention-backend flashinfer", ("Olmo2ForCausalLM", "olmo2"), "sm90", "olmo2.no-flashinfer"),
        ("--attention-backend fa3", ("Gemma4ForCausalLM", "gemma4_text"), "sm90", "gemma4.backends"),
        ("--prefill-attention-backend flashinfer", ("Gemma4ForCausalLM", "gemma4_text"), "sm90", "gemma4.backends"),
        ("", ("Exaone4ForCausalLM", "exaone4", EXAONE4), "sm80", "exaone4.backends"),  # the default flashinfer
        ("--attention-backend fa4", ("Exaone4ForCausalLM", "exaone4", EXAONE4), "sm100", "exaone4.backends"),
        (
            "--attention-backend triton",
            ("Lfm2ForCausalLM", "lfm2", LFM2),
            "sm90",
            "hybrid.first-layer-not-attention-no-triton",
        ),
        (
            "--attention-backend triton",
            ("NemotronHForCausalLM", "nemotron_h"),
            "sm90",
            "hybrid.first-layer-not-attention-no-triton",
        ),
        ("--page-size 16", ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT), "sm90", "mamba.radix-cache-page-size-1"),
        (
            "--attention-backend torch_native",
            ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT),
            "sm100",
            "hybrid-gdn.blackwell-backends",
        ),
        (
            "--attention-backend fa4 --disable-radix-cache",
            ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT),
            "sm120",
            "hybrid-gdn.blackwell-backends",
        ),  # fa4 on SM100 only
        (
            "--attention-backend fa4",
            ("FalconH1ForCausalLM", "falcon_h1"),
            "sm100",
            "mamba.radix-cache-page-size-1",
        ),  # FA4's 128
    ],
)
def test_model_override_rejections(flags, arch, gpu, rule):
    facts = _as_architecture(*arch[:2], **(arch[2] if len(arch) > 2 else {}))
    assert rule in refusing_rules_of(
        lambda: resolve(ServerArgs.from_flags(flags.split()), facts, fa3_gpu(gpu))
    )  # refused, or its default backend refused


# ---- --prefill-only-disable-kv-cache (R34): a no-op KV pool ----------------------------------------

PREFILL_ONLY = "--is-embedding --prefill-only-disable-kv-cache --chunked-prefill-size -1 --disable-radix-cache"


def test_prefill_only_disable_kv_cache_takes_the_fa_fast_path_on_every_layer():
    r = resolve_flags(PREFILL_ONLY, "Qwen3-Embedding-8B")
    assert r.plan.prefill_backend == "fa3" and r.plan.fa.skip_kv_cache
    assert not r.plan.layer("full").common.write_kv_cache and r.plan.mode("extend").fa.kv_extent == "none"


@pytest.mark.parametrize(
    "flags, name, gpu, rule",
    [
        (
            "--prefill-only-disable-kv-cache --chunked-prefill-size -1 --disable-radix-cache",
            "Qwen3-Embedding-8B",
            "sm90",
            "prefill-only-kv.needs-embedding",
        ),
        (
            "--is-embedding --prefill-only-disable-kv-cache --disable-radix-cache",
            "Qwen3-Embedding-8B",
            "sm90",
            "prefill-only-kv.needs-unchunked-prefill",
        ),  # chunked_prefill_size left unset is not -1
        (
            "--is-embedding --prefill-only-disable-kv-cache --chunked-prefill-size -1",
            "Qwen3-Embedding-8B",
            "sm90",
            "prefill-only-kv.needs-no-radix-cache",
        ),
        (
            PREFILL_ONLY + " --kv-cache-dtype mxfp8",
            "Qwen3-Embedding-8B",
            "sm100",
            "prefill-only-kv.no-fp4-or-mxfp8-pool",
        ),
        (
            PREFILL_ONLY + " --attn-cp-size 2 --tp-size 2",
            "Qwen3-Embedding-8B",
            "sm90",
            "prefill-only-kv.no-context-parallel-or-hisparse",
        ),
        (
            PREFILL_ONLY + " --enable-hisparse",
            "Qwen3-Embedding-8B",
            "sm90",
            "prefill-only-kv.no-context-parallel-or-hisparse",
        ),
        (PREFILL_ONLY, "Qwen3-Embedding-8B", "sm80", "prefill-only-kv.prefill-on-fa"),  # the default flashinfer
        (
            PREFILL_ONLY + " --attention-backend fa3",
            "DeepSeek-V2-Lite",
            "sm90",
            "prefill-only-kv.layers-the-fast-path-skips",
        ),
        (
            PREFILL_ONLY + " --attention-backend fa3",
            "Llama-3.2-11B-Vision-Instruct",
            "sm90",
            "prefill-only-kv.layers-the-fast-path-skips",
        ),
        (
            "--attention-backend trtllm_mha --attn-cp-size 2 --tp-size 2",
            "Llama-3.1-8B",
            "sm90",
            "trtllm-mha.prefill-cp-blackwell",
        ),
        (
            "--attention-backend trtllm_mha --kv-cache-dtype fp8_e4m3",
            "Qwen3-8B",
            "sm120",
            "trtllm-mha.sm120-prefill-fp8-kv",
        ),
        ("--attn-cp-size 3 --tp-size 4", "Llama-3.1-8B", "sm90", "attention-cp.divides-attention-tp"),
        (
            "--attn-cp-size 4 --tp-size 4 --dp-size 2 --enable-dp-attention",
            "Llama-3.1-8B",
            "sm90",
            "attention-cp.divides-attention-tp",
        ),
    ],
)
def test_prefill_only_and_context_parallel_rejections(flags, name, gpu, rule):
    assert rule in refusing_rules_of(
        lambda: resolve(ServerArgs.from_flags(flags.split()), model(name), fa3_gpu(gpu))
    )  # refused, or its default backend refused


@pytest.mark.parametrize(
    "flags, attn_tp, q_heads",
    [
        ("--tp-size 8", 8, 4),
        ("--tp-size 8 --attn-cp-size 2", 4, 8),  # SGLang's derive_attention_widths: CP ranks take a share of TP
        ("--tp-size 8 --dp-size 2 --enable-dp-attention --attn-cp-size 2", 2, 16),
    ],
)
def test_attention_context_parallelism_narrows_attention_tp(flags, attn_tp, q_heads):
    plan = resolve_flags(flags, "Llama-3.1-8B").plan
    assert (plan.common.attn_tp_size, plan.common.num_q_heads_per_rank) == (attn_tp, q_heads)


# ---- dual chunk attention (R23: no backend of its own in 0.5.23) and cutedsl_mla (R16) ------------------------------------------------


def _dual_chunk() -> ModelFacts:
    """Qwen2.5-7B-Instruct-1M: Qwen2.5-7B's attention with a dual_chunk_attention_config."""
    raw = json.loads((MODELS / "Qwen2.5-7B-Instruct.json").read_text())
    raw["dual_chunk_attention_config"] = {
        "chunk_size": 262144,
        "local_size": 8192,
        "original_max_position_embeddings": 262144,
    }
    return ModelFacts.from_hf_dict(raw)


def test_dual_chunk_attention_config_takes_the_generic_backend():
    # SGLang 0.5.23 has no dual_chunk_flash_attn backend: the config only changes the rotary embedding
    r = resolve(ServerArgs.from_flags(["--enable-mixed-chunk"]), _dual_chunk(), fa3_gpu("sm90"))
    assert r.plan.prefill_backend == "fa3"
    assert not r.server_args.disable_radix_cache and r.server_args.enable_mixed_chunk


def test_cutedsl_mla_decodes_with_trtllm_mla_prefill_on_64_token_pages():
    r = resolve(
        ServerArgs.from_flags(["--attention-backend", "cutedsl_mla"]), model("DeepSeek-V3"), Platform.from_name("sm100")
    )
    assert (r.plan.prefill_backend, r.plan.decode_backend, r.plan.common.page_size) == ("trtllm_mla", "cutedsl_mla", 64)
    r = resolve(
        ServerArgs.from_flags("--attention-backend cutedsl_mla --page-size 32".split()),
        model("DeepSeek-V3"),
        Platform.from_name("sm100"),
    )
    assert r.plan.common.page_size == 32


@pytest.mark.parametrize(
    "flags, gpu, rule",
    [
        ("--attention-backend cutedsl_mla --prefill-attention-backend cutedsl_mla", "sm100", "cutedsl-mla.decode-only"),
        ("--attention-backend cutedsl_mla", "sm90", "cutedsl-mla.sm100-only"),
        ("--attention-backend cutedsl_mla --kv-cache-dtype fp8_e5m2", "sm100", "cutedsl-mla.kv-dtype"),
    ],
)
def test_cutedsl_mla_rejections(flags, gpu, rule):
    assert rule in refusing_rules_of(
        lambda: resolve(ServerArgs.from_flags(flags.split()), model("DeepSeek-V3"), Platform.from_name(gpu))
    )  # refused, or its default backend refused


# ---- multi-item scoring (R31, F2, F14) -----------------------------------------------------------------


def test_multi_item_scoring_runs_one_uncached_paged_prefill_on_flashinfer():
    r = resolve_flags("--enable-mis --attention-backend flashinfer", "Qwen3-8B")
    assert (
        r.server_args.disable_cuda_graph
        and r.server_args.disable_radix_cache
        and r.server_args.chunked_prefill_size == -1
    )
    fi = r.plan.flashinfer
    assert fi.multi_item_scoring and not fi.use_ragged_prefill and fi.prefill_kernel_family == "fa2"


@pytest.mark.parametrize(
    "flags, name, rule",
    [
        ("--enable-mis", "Qwen3-8B", "mis.flashinfer-only"),  # the default fa3 on SM90
        (
            "--enable-mis --attention-backend flashinfer --decode-attention-backend triton",
            "Qwen3-8B",
            "mis.flashinfer-only",
        ),
        (
            "--enable-mis --attention-backend flashinfer",
            "gemma-2-9b",
            "mis.no-sliding-window",
        ),  # SGLang drops the window
    ],
)
def test_multi_item_scoring_rejections(flags, name, rule):
    assert rule in refusing_rules_of(lambda: resolve_flags(flags, name))  # refused, or its default backend refused


# ---- DeepSeek Sparse Attention (R61) ----------------------------------------------------------------------


def _deepseek_v32() -> ModelFacts:
    """DeepSeek-V3.2: DeepSeek-V3's MLA with the DSA indexer (index_topk) under its own architecture name."""
    raw = json.loads((MODELS / "DeepSeek-V3.json").read_text())
    raw.update(architectures=["DeepseekV32ForCausalLM"], index_topk=2048, index_head_dim=128, index_n_heads=64)
    return ModelFacts.from_hf_dict(raw)


@pytest.mark.parametrize(
    "args, gpu, backend, page_size, kv_dtype",
    [
        ({}, "sm90", "dsa", 64, "bfloat16"),
        ({}, "sm100", "dsa", 64, "fp8_e4m3"),  # not R62's trtllm_mla: SGLang's override checks DSA first
        ({"page_size": 16, "kv_cache_dtype": "bf16"}, "sm90", "dsa", 64, "bf16"),  # the override's 64 wins
        # cutlass's later 128 wins (a ServerArgs only: SGLang 0.5.23's launch line no longer offers cutlass_mla)
        ({"attention_backend": "cutlass_mla"}, "sm100", "cutlass_mla", 128, "fp8_e4m3"),
    ],
)
def test_deepseek_sparse_attention_defaults(args, gpu, backend, page_size, kv_dtype):
    r = resolve(ServerArgs(**args), _deepseek_v32(), Platform.from_name(gpu))
    assert (r.plan.prefill_backend, r.plan.common.page_size, r.server_args.kv_cache_dtype) == (
        backend,
        page_size,
        kv_dtype,
    )


def test_deepseek_sparse_attention_refuses_other_kv_dtypes_and_plain_deepseek_v3_is_not_dsa():
    with pytest.raises(PlanError) as err:
        resolve(ServerArgs(kv_cache_dtype="fp8_e5m2"), _deepseek_v32(), Platform.from_name("sm90"))
    assert "kv-dtype.dsa" in {v.rule for v in err.value.violations}
    assert not model("DeepSeek-V3").has_dsa_indexer
    assert resolve(ServerArgs(), model("DeepSeek-V3"), Platform.from_name("sm100")).plan.prefill_backend == "trtllm_mla"


@pytest.mark.parametrize(
    "flags, gpu, radix_off",
    [
        ("", "sm90", False),  # page 1, no speculation: the Mamba radix cache stays
        (
            "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
            "sm90",
            True,
        ),
        ("--disable-radix-cache --page-size 16", "sm90", True),  # pages of any size once the radix cache is off
        ("--attention-backend trtllm_mha", "sm100", True),  # trtllm_mha takes no page_size 1
    ],
)
def test_a_hybrid_models_radix_cache(flags, gpu, radix_off):
    facts = _as_architecture("Qwen3NextForCausalLM", "qwen3_next", **QWEN3_NEXT)
    assert facts.has_recurrent_layers and not model("Llama-3.1-8B").has_recurrent_layers
    r = resolve(ServerArgs.from_flags(flags.split()), facts, fa3_gpu(gpu))
    assert r.server_args.disable_radix_cache == radix_off


@pytest.mark.parametrize("gpu", ["sm90", "sm100"])
def test_explain_backend_verdicts_are_what_asking_for_each_backend_gives(gpu):
    """explain's per-backend verdict is the outcome of asking for that backend with the same other arguments:
    accepted (or chosen) exactly when resolve() with --attention-backend B keeps B for both phases. EmbeddingGemma
    included: its no-KV-pool adjustment (R33) is made only for an FA or unset backend, so triton stays accepted."""
    from tests.support.helpers import MODELS, embedding_gemma

    configs = [model(p.stem) for p in sorted(MODELS.glob("*.json"))] + [embedding_gemma()]
    explained = 0
    for facts in configs:
        try:  # (EmbeddingGemma's default on SM100 is refused: trtllm_mha cannot run without a KV pool, as in SGLang)
            verdicts = {
                v.backend: v for v in resolve(ServerArgs(), facts, Platform.from_name(gpu)).explanation.backends
            }
        except PlanError:
            continue
        explained += 1
        for backend, verdict in verdicts.items():
            try:
                r = resolve(ServerArgs(attention_backend=backend), facts, Platform.from_name(gpu))
                kept = r.plan.prefill_backend == r.plan.decode_backend == backend
            except PlanError:
                kept = False
            assert (verdict.status != "rejected") is kept, (facts.source, backend, verdict)
    assert explained >= len(configs) - 1


# ---- which backend runs each forward mode -------------------------------------------------------


@pytest.mark.parametrize("spec_mode", ["prefill", "decode"])
def test_each_mode_runs_on_the_backend_sglangs_hybrid_backend_picks(spec_mode):
    """Prefill on FA3, decode on FlashInfer (SGLang's HybridAttnBackend, section 3.1): DECODE and IDLE run on the decode
    backend, TARGET_VERIFY on the decode backend only under --speculative-attention-mode decode, the rest on prefill."""
    flags = (
        "--prefill-attention-backend fa3 --decode-attention-backend flashinfer --speculative-algorithm EAGLE "
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "
        f"--speculative-attention-mode {spec_mode}"
    )
    r = resolve_flags(flags, "Llama-3.1-8B", "sm90")
    plan = r.plan
    on_decode = {ForwardMode.DECODE, ForwardMode.IDLE} | (
        {ForwardMode.TARGET_VERIFY} if spec_mode == "decode" else set()
    )
    for mode in ForwardMode:
        assert plan.mode(mode).common.runs_on == ("decode" if mode in on_decode else "prefill"), mode
        assert plan.backend_for(mode) == ("flashinfer" if mode in on_decode else "fa3"), mode
    origin = r.explanation.modes["target_verify"]["common.runs_on"].origin
    assert origin == ("hybrid.verify-on-decode-backend-in-decode-mode" if spec_mode == "decode" else "default")
    one = resolve_flags("--attention-backend flashinfer", "Llama-3.1-8B", "sm90").plan  # one backend: nothing to route
    assert all(one.mode(m).common.runs_on == "prefill" and one.backend_for(m) == "flashinfer" for m in ForwardMode)


@pytest.mark.parametrize(
    "flags, model, gpu, rule",
    [  # SGLang 0.5.23's start-up checks, found by attngate conform
        (
            "--enable-unified-memory --speculative-algorithm NGRAM",
            "Qwen3-8B",
            "sm90",
            "unified-memory.speculative-algorithms",
        ),
        ("--enable-unified-memory --speculative-eagle-topk 2", "Qwen3-8B", "sm90", "unified-memory.linear-draft-chain"),
        (  # no algorithm: the speculative settings are refused
            "--attention-backend trtllm_mha --speculative-eagle-topk 2",
            "Qwen3-8B",
            "sm100",
            "spec.settings-need-an-algorithm",
        ),
        (
            "--enable-unified-memory --speculative-algorithm EAGLE",
            "Qwen3-8B",
            "sm90",
            "unified-memory.eagle-needs-unified-target",
        ),
        (
            "--enable-unified-memory --kv-cache-dtype fp4_mx_block16 --attention-backend triton",
            "Qwen3-8B",
            "sm90",
            "unified-memory.no-fp4-kv",
        ),
        ("--kv-cache-dtype nvfp4 --attention-backend triton", "Qwen3-8B", "sm100", "kv-dtype.nvfp4-backends"),
        (
            "--kv-cache-dtype nvfp4 --decode-attention-backend flashinfer",
            "Qwen3-8B",
            "sm100",
            "kv-dtype.nvfp4-backends",
        ),
        (
            "--kv-cache-dtype nvfp4 --speculative-algorithm EAGLE --speculative-draft-attention-backend fa4",
            "Qwen3-8B",
            "sm100",
            "kv-dtype.nvfp4-draft-backend",
        ),
        (
            "--prefill-attention-backend fa4",
            "gpt-oss-20b",
            "sm100",
            "attngate",
        ),  # no override, no decode backend: as SGLang
        (
            "--kv-cache-dtype nvfp4 --speculative-algorithm DFLASH --speculative-draft-model-path d",
            "Qwen3-8B",
            "sm100",
            "kv-dtype.nvfp4-native-speculation",
        ),
        (
            "--kv-cache-dtype nvfp4 --disaggregation-mode decode",
            "Qwen3-8B",
            "sm100",
            "kv-dtype.nvfp4-native-host-and-transfer-pools",
        ),
        ("--speculative-algorithm EAGLE --speculative-num-steps 2", "Qwen3-8B", "sm90", "spec.params-all-or-none"),
        (
            "--attention-backend trtllm_mla --kv-cache-dtype bfloat16",
            "DeepSeek-V3",
            "sm100",
            "trtllm-mla.kv-dtype",
        ),  # "bf16" only
        (
            "--dp-size 2 --enable-prefill-cp",
            "DeepSeek-V3",
            "sm90",
            "dp-attention.tp-divisible-by-dp",
        ),  # MLA CP: DP attention
    ],
)
def test_sglang_start_up_refusals(flags, model, gpu, rule):
    assert rule in refusing_rules_of(
        lambda: resolve_flags(flags, model, gpu)
    )  # refused, or its default backend refused


def test_mla_prefill_cp_runs_dp_groups_as_attention_dp_and_the_rest_as_attention_cp():
    args = resolve_flags("--tp-size 8 --dp-size 2 --enable-prefill-cp", "DeepSeek-V3").server_args
    assert (args.enable_dp_attention, args.dp_size, args.attn_cp_size) == (True, 2, 4)  # as SGLang 0.5.23 resolves it


@pytest.mark.parametrize(
    "flags, name, gpu, deviation",
    [  # where SGLang 0.5.23 differs on purpose (deviations:)
        (
            "--speculative-algorithm NGRAM --attention-backend flashinfer --prefill-attention-backend trtllm_mha",
            "Qwen3-8B",
            "sm100",
            "sglang.ngram-tree-on-trtllm-mha",
        ),
        (
            "--kv-cache-dtype fp4_mx_block16 --enable-hierarchical-cache",
            "Mistral-7B-v0.1",
            "sm90",
            "sglang.hicache-kernel-io-fp4-cache-split",
        ),
    ],
)
def test_deviations_apply_where_sglang_resolves_otherwise(flags, name, gpu, deviation):
    try:
        applied = resolve_flags(flags, name, gpu).deviations
    except PlanError as err:
        applied = err.deviations
    assert deviation in [d.id for d in applied]


@pytest.mark.parametrize(
    "flags",
    [
        "--speculative-eagle-topk 4 --speculative-num-draft-tokens 8",
        "--speculative-eagle-topk 1 --page-size 16",
        "--speculative-num-steps 3",
        "--attention-backend flashinfer --speculative-eagle-topk 4",
    ],
)
@pytest.mark.parametrize(
    "name, gpu", [("Llama-3.1-8B", "sm90"), ("Llama-3.1-8B", "sm100"), ("DeepSeek-V2-Lite", "sm90")]
)
def test_speculative_settings_without_an_algorithm_are_refused(flags, name, gpu):
    """spec.settings-need-an-algorithm: refused rather than planned (SGLang lets the topk alone pick another default
    backend for a server that never drafts), declared as deviation sglang.speculative-settings-without-an-algorithm;
    with an algorithm the same settings resolve (issue 42)."""
    assert "spec.settings-need-an-algorithm" in refusing_rules_of(lambda: resolve_flags(flags, name, gpu))
    with pytest.raises(PlanError) as err:
        resolve_flags(flags, name, gpu)
    assert "sglang.speculative-settings-without-an-algorithm" in [d.id for d in err.value.deviations]
    eagle = "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1"
    assert "spec.settings-need-an-algorithm" not in refusing_rules_of(lambda: resolve_flags(eagle, name, gpu))


@pytest.mark.parametrize("kernels, fallback", [("sglang", "fa3"), ("attngate", "torch_native")])
@pytest.mark.parametrize("head_dim, refused", [(8, True), (16, False)])
def test_triton_refuses_a_qk_head_dim_below_9(head_dim, refused, kernels, fallback):
    """triton.qk-head-dim-at-least-9 (Triton's tl.dot needs K >= 16 and SGLang's kernels tile the head dim to a power
    of two): on SM80, where triton is the default, the default falls back to the first candidate that runs: FA3 where
    sgl_kernel's build is installed (FA3 runs a head dim <= 64 with its 64-wide kernel), else torch_native."""
    facts = ModelFacts.from_hf_dict({**json.loads((MODELS / "Qwen3-8B.json").read_text()), "head_dim": head_dim})
    platform = Platform.from_name("sm80", kernels=[kernels])
    named = lambda: resolve(ServerArgs(attention_backend="triton"), facts, platform)  # noqa: E731
    assert ("triton.qk-head-dim-at-least-9" in refusing_rules_of(named)) == refused
    assert resolve(ServerArgs(), facts, platform).plan.prefill_backend == (fallback if refused else "triton")


@pytest.mark.parametrize("page_size, refused", [(4096, False), (8192, False), (65536, True)])
def test_chunked_local_attention_on_fa_needs_pages_that_divide_the_chunk(page_size, refused):
    """fa.local-attention-chunk-a-multiple-of-page-size: Llama 4's chunks of 8192 over pages that do not divide them
    are refused at start-up on fa3 (SGLang's FA backend asserts it at the first batch; declared in
    sglang.kernel-limits-at-start-up); triton, SM80's default for Llama 4, is not held to it."""
    name, rule = "Llama-4-Scout-17B-16E-Instruct", "fa.local-attention-chunk-a-multiple-of-page-size"
    assert (rule in refusing_rules_of(lambda: resolve_flags(f"--page-size {page_size}", name, "sm90"))) == refused
    assert rule not in refusing_rules_of(lambda: resolve_flags(f"--page-size {page_size}", name, "sm80"))


def test_a_model_with_window_and_cross_attention_layers_is_refused():
    """swa-and-cross-attention-exclusive: no config.json the reader takes makes such a model (Mllama's layout comes
    from its cross_attention_layers alone), but a library caller's ModelFacts can: one Mllama layer made sliding."""
    from attngate.facts.modes import LayerKind

    mllama = ModelFacts.from_hf_config(MODELS / "Llama-3.2-11B-Vision-Instruct.json")
    kinds = (LayerKind.SLIDING_WINDOW, *mllama.layer_kinds[1:])
    facts = mllama.model_copy(update=dict(layer_kinds=kinds, sliding_window=4096))
    refused = lambda: resolve(ServerArgs(), facts, Platform.from_name("sm90"))  # noqa: E731
    assert "swa-and-cross-attention-exclusive" in refusing_rules_of(refused)
    assert "swa-and-cross-attention-exclusive" not in refusing_rules_of(
        lambda: resolve(ServerArgs(), mllama, Platform.from_name("sm90"))
    )
