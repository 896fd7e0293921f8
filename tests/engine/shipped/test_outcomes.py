"""Shipped rules end to end, across sections: a launch line, a model and a GPU, and what the resolution holds."""

from __future__ import annotations

import pytest

from attngate import ForwardMode, ServerArgs, resolve
from tests.engine.shipped.common import SGLANG_FLASHINFER_PLAN_TIME
from tests.support.helpers import fa3_gpu, model


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
