"""rules.yaml "Model-specific constraints" and "Hybrid models with recurrent layers": dual chunk attention (R23),
cutedsl_mla (R16) and the deprecated names SGLang renames (tokenspeed_mla, compressed), DeepSeek Sparse Attention (R61), a hybrid model's radix cache, and a model with both window and
cross-attention layers."""

from __future__ import annotations

import json

import pytest

from attngate import ModelFacts, PlanError, Platform, ServerArgs, resolve
from tests.engine.shipped.common import QWEN3_NEXT, as_architecture
from tests.support.helpers import MODELS, fa3_gpu, model, refusing_rules_of


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


@pytest.mark.parametrize(
    "flags, expected",
    [
        # (prefill, decode, page size, KV cache dtype, speculative_attention_mode)
        ("--attention-backend tokenspeed_mla", ("trtllm_mla", "cutedsl_mla", 64, "fp8_e4m3", "prefill")),
        (
            "--attention-backend tokenspeed_mla --kv-cache-dtype bf16",
            ("trtllm_mla", "cutedsl_mla", 64, "fp8_e4m3", "prefill"),
        ),
        ("--decode-attention-backend tokenspeed_mla", ("trtllm_mla", "cutedsl_mla", 64, "fp8_e4m3", "prefill")),
        (  # both phases given as it: decode cutedsl_mla, prefill trtllm_mla, no longer one backend
            "--prefill-attention-backend tokenspeed_mla --decode-attention-backend tokenspeed_mla",
            ("trtllm_mla", "cutedsl_mla", 64, "fp8_e4m3", "prefill"),
        ),
        (  # a prefill named so is trtllm_mla; the KV cache is left as given
            "--prefill-attention-backend tokenspeed_mla --decode-attention-backend cutedsl_mla",
            ("trtllm_mla", "cutedsl_mla", 64, "auto", "prefill"),
        ),
        (
            "--attention-backend tokenspeed_mla --speculative-algorithm EAGLE --speculative-num-steps 1 "
            "--speculative-eagle-topk 1 --speculative-num-draft-tokens 2",
            ("trtllm_mla", "cutedsl_mla", 64, "fp8_e4m3", "decode"),
        ),
        ("--attention-backend compressed", ("dsv4", "dsv4", 1, "auto", "prefill")),
    ],
)
def test_deprecated_backend_names_run_as_sglang_renames_them(flags, expected):
    """SGLang 0.5.23's _handle_deprecated_args (backend-alias.*; sglang pull 28201: tokenspeed_mla over the default
    auto KV cache failed at start-up); conform checks the same lines against SGLang itself."""
    r = resolve(ServerArgs.from_flags(flags.split()), model("Kimi-K2-Instruct"), Platform.from_name("sm100"))
    args = r.server_args
    got = (r.plan.prefill_backend, r.plan.decode_backend, r.plan.common.page_size, args.kv_cache_dtype)
    assert (*got, args.speculative_attention_mode) == expected
    assert "tokenspeed_mla" not in (
        args.attention_backend,
        args.prefill_attention_backend,
        args.decode_attention_backend,
    )
    assert any(a.rule.startswith("backend-alias.") for a in r.adjustments)


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


EAGLE = "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"


@pytest.mark.parametrize(
    "flags, gpu, arch, radix_off",
    [
        ("", "sm90", "Qwen3NextForCausalLM", False),  # page 1, no speculation: the Mamba radix cache stays
        (EAGLE, "sm90", "Qwen3NextForCausalLM", False),  # the extra buffer (SGLang's default here) keeps it
        (EAGLE, "sm90", "Lfm2ForCausalLM", True),  # no_buffer: speculation turns it off
        ("--disable-radix-cache --page-size 16", "sm90", "Qwen3NextForCausalLM", True),  # any page once it is off
        ("--page-size 64", "sm90", "Qwen3NextForCausalLM", False),  # 64 divides the extra buffer's interval
        ("--attention-backend trtllm_mha", "sm100", "Qwen3NextForCausalLM", False),
        ("--attention-backend trtllm_mha", "sm100", "Lfm2ForCausalLM", True),  # trtllm_mha takes no page_size 1
    ],
)
def test_a_hybrid_models_radix_cache(flags, gpu, arch, radix_off):
    """mamba.*: SGLang 0.5.23 keeps the radix cache of an extra-buffer hybrid (Qwen3-Next, Qwen3.5) with speculation,
    trtllm_mha and pages dividing 256; a no_buffer one (LFM2) needs page 1 and no speculation."""
    facts = as_architecture(arch, arch.removesuffix("ForCausalLM").lower(), **QWEN3_NEXT)
    assert facts.has_recurrent_layers and not model("Llama-3.1-8B").has_recurrent_layers
    r = resolve(ServerArgs.from_flags(flags.split()), facts, fa3_gpu(gpu))
    assert r.server_args.disable_radix_cache == radix_off


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
