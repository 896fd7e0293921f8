"""rules.yaml "Embedding servers without a KV pool" (--prefill-only-disable-kv-cache, R34: a no-op KV pool) and
"Parallelism" (attention context parallelism, the heads each attention TP rank holds per layer kind)."""

from __future__ import annotations

import pytest

from attngate import ServerArgs, resolve
from tests.support.helpers import fa3_gpu, model, refusing_rules_of, resolve_flags

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


def test_mla_prefill_cp_runs_dp_groups_as_attention_dp_and_the_rest_as_attention_cp():
    args = resolve_flags("--tp-size 8 --dp-size 2 --enable-prefill-cp", "DeepSeek-V3").server_args
    assert (args.enable_dp_attention, args.dp_size, args.attn_cp_size) == (True, 2, 4)  # as SGLang 0.5.23 resolves it


@pytest.mark.parametrize(
    "flags, full, sliding",
    [
        ("--tp 1", (64, 4), (64, 8)),
        ("--tp 2", (32, 2), (32, 4)),
        ("--tp 4", (16, 1), (16, 2)),  # the full layers' 4 KV heads run out first: one per rank, replicated
        ("--tp 8", (8, 1), (8, 1)),
        ("--tp 16", (4, 1), (4, 1)),
        ("--tp 8 --dp 4 --enable-dp-attention", (32, 2), (32, 4)),  # attention TP is 8 / 4 ranks
    ],
)
def test_a_sliding_window_layer_splits_its_own_heads_over_the_attention_tp_ranks(flags, full, sliding):
    """MiMo-V2-Flash: 64 query heads in every layer, 4 KV heads in its full layers and 8 in its sliding-window ones
    (swa_num_key_value_heads). Each layer kind's heads per rank are its own (SGLang's get_swa_num_kv_heads), KV heads
    replicated once the ranks outnumber them."""
    plan = resolve_flags(flags, "MiMo-V2-Flash").plan
    assert plan.heads_per_rank("full") == full
    assert plan.heads_per_rank("sliding_window") == sliding
    assert (plan.common.swa_num_q_heads_per_rank, plan.common.swa_num_kv_heads_per_rank) == sliding
