"""Shipped rules end to end, across sections: a launch line, a model and a GPU that the named rule refuses."""

from __future__ import annotations

import pytest

from attngate import Platform, ServerArgs, resolve
from tests.support.helpers import model, refusing_rules_of


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
