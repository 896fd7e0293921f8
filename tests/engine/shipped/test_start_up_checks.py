"""SGLang 0.5.23's start-up checks found by attngate conform (unified memory, NVFP4 caches, speculative settings), and
the deviations: where attngate resolves otherwise on purpose."""

from __future__ import annotations

import pytest

from attngate import PlanError
from tests.support.helpers import refusing_rules_of, resolve_flags


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


@pytest.mark.parametrize(
    "flags, gpu, refused",
    [
        ("--attention-backend trtllm_mha --kv-cache-dtype nvfp4", "sm120", True),  # native NVFP4 prefill: SM100 only
        ("--prefill-attention-backend trtllm_mha --kv-cache-dtype nvfp4", "sm121", True),
        ("--attention-backend trtllm_mha --kv-cache-dtype nvfp4", "sm100", False),
        ("--kv-cache-dtype nvfp4", "sm120", False),  # the FP8 workspace on flashinfer
        ("--attention-backend flashinfer --kv-cache-dtype nvfp4", "sm120", False),
    ],
)
def test_native_nvfp4_prefill_runs_on_sm100_only(flags, gpu, refused):
    """kv-dtype.nvfp4-native-prefill-sm100-only: SGLang maps an explicit trtllm_mha prefill to native NVFP4 and refuses
    it off SM100 (handle_nvfp4_prefill_kv_dequant_dtype); selecting the dtype alone prefills from FP8 on flashinfer."""
    rule = "kv-dtype.nvfp4-native-prefill-sm100-only"
    assert (rule in refusing_rules_of(lambda: resolve_flags(flags, "Llama-3.1-8B", gpu))) == refused
