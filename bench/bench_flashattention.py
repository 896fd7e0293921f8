"""FlashAttention backend benchmarks on the GPU; prints one JSON object (run on the device).

- decode 64 x 4096 and causal prefill 8 x 4096 (32/8 heads, head_dim 128, bf16): through the
  backend (init_forward_metadata + forward) and the raw kernel call on the same tensors, side by side
  (decode also against the pool's KV write plus the raw call, since the forward writes first);
- embedding workload (64 x 512 and 8 x 4096): the fast path (fa.skip_kv_cache) against the paged path;
- host time per step: bench/bench_host.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from flash_attn.cute import flash_attn_varlen_func  # noqa: E402

from attngate import ForwardMode, LayerKind  # noqa: E402
from attngate.backends.flashattention import FlashAttentionBackend  # noqa: E402
from tests.support.backend_cases import GPU, layer_of, make_case, plan_for  # noqa: E402

H, HKV, D = GPU.heads
from common import cuda_ms, host_us, paired_ms  # noqa: E402

PS = 128


def backend_and_raw(requests, mode, plan):
    layer = layer_of(GPU, LayerKind.FULL)
    case = make_case(
        GPU,
        requests,
        mode,
        PS,
        num_slots=len(requests) * (max(p + n for p, n in requests) + PS) // PS * PS + PS,
        max_context_len=max(p + n for p, n in requests) + PS,
    )
    fa = FlashAttentionBackend(plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], "cuda")
    batch = case.setup.batch

    def step():
        fa.init_forward_metadata(batch)
        return fa.forward(case.q, case.k, case.v, layer, batch)

    step()
    md = fa.md

    def layer_forward():  # what each layer pays: metadata is prepared once per batch for all layers
        return fa.forward(case.q, case.k, case.v, layer, batch)

    k_cache, v_cache = case.pools[0].get_kv_buffer(0)
    kc, vc = k_cache.view(-1, PS, HKV, D), v_cache.view(-1, PS, HKV, D)

    def raw():
        return flash_attn_varlen_func(
            case.q,
            kc,
            vc,
            cu_seqlens_q=md.cu_seqlens_q,
            max_seqlen_q=md.max_seqlen_q,
            seqused_k=md.seqused_k,
            page_table=md.page_table,
            softmax_scale=D**-0.5,
            causal=True,
            num_splits=plan.fa.num_splits,
        )

    return fa, case, layer, step, raw, layer_forward


def main() -> None:
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    plan = plan_for(GPU, page_size=PS)
    out["plan"] = {"provider": plan.fa.provider, "num_splits": plan.fa.num_splits}

    fa, case, _, step, raw, layer_forward = backend_and_raw([(4095, 1)] * 64, ForwardMode.DECODE, plan)
    kv_bytes = 64 * 4096 * HKV * D * 2 * 2
    (t_b, t_r), t_s = paired_ms(layer_forward, raw), cuda_ms(step)
    batch, pool = case.setup.batch, case.pools[0]
    t_b2, t_w = paired_ms(layer_forward, lambda: (pool.set_kv_buffer(0, batch.out_cache_loc, case.k, case.v), raw()))
    out["decode_64x4096"] = {
        "backend_layer_ms": round(t_b, 4),
        "raw_ms": round(t_r, 4),
        "backend_TBps": round(kv_bytes / t_b / 1e9, 3),
        "raw_TBps": round(kv_bytes / t_r / 1e9, 3),
        "backend_over_raw": round(t_b / t_r, 3),
        "raw_kv_write_plus_call_ms": round(t_w, 4),
        "backend_over_raw_kv_write_plus_call": round(t_b2 / t_w, 3),
        "metadata_plus_one_layer_ms": round(t_s, 4),
        "metadata_host_us": round(host_us(lambda: fa.init_forward_metadata(case.setup.batch)), 1),
    }

    fa, case, _, step, raw, layer_forward = backend_and_raw([(0, 4096)] * 8, ForwardMode.EXTEND, plan)
    flops = 8 * 4 * H * D * 4096 * 4096 / 2
    t_b, t_r = paired_ms(layer_forward, raw, iters=10)
    out["prefill_8x4096_causal"] = {
        "backend_layer_ms": round(t_b, 3),
        "raw_ms": round(t_r, 3),
        "backend_TFLOPs": round(flops / t_b / 1e9, 1),
        "raw_TFLOPs": round(flops / t_r / 1e9, 1),
        "backend_over_raw": round(t_b / t_r, 3),
    }

    fast = plan_for(GPU, page_size=PS, is_embedding=True, chunked_prefill_size=-1, disable_radix_cache=True)
    for name, requests in (("embedding_64x512", [(0, 512)] * 64), ("embedding_8x4096", [(0, 4096)] * 8)):
        _, _, _, paged_step, _, _ = backend_and_raw(requests, ForwardMode.EXTEND, plan)
        _, _, _, fast_step, _, _ = backend_and_raw(requests, ForwardMode.EXTEND, fast)
        t_p, t_f = paired_ms(paged_step, fast_step, iters=10)
        out[name] = {"paged_ms": round(t_p, 3), "fast_path_ms": round(t_f, 3), "fast_over_paged": round(t_f / t_p, 3)}

    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
