"""MLA benchmarks on the GPU (FlashInfer MLA through the backend); prints one JSON object (run on the device).

- absorbed decode 64 x 4096, page 64, 16 heads (DeepSeek-V2-Lite) and 128 heads (DeepSeek-V3): the
  backend's forward (latent write, q_nope absorbed through w_kc, BatchMLAPagedAttentionWrapper.run,
  output through w_vc) against the same four steps written by hand on the raw wrapper, timed
  alternately in one run; and the raw wrapper's run alone, as latent bytes read per second;
- non-absorbed prefill 4 x 4096, 16 heads, q/k 192, v 128: the backend's forward (decompress the
  latent, ragged run) against the same steps by hand; and the raw ragged run alone, TFLOP/s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from common import cuda_ms, paired_ms  # noqa: E402

from attngate import ForwardMode  # noqa: E402
from attngate.backends.flashinfer import flashinfer_backend  # noqa: E402
from attngate.backends.mla import absorb_q, decompress, project_out  # noqa: E402
from tests.gpu.test_mla_and_local import MLA_MODELS, RANK, ROPE, mla_case, mla_layer  # noqa: E402
from tests.support.backend_cases import GPU, plan_for  # noqa: E402

PS = 64


def decode(heads: int, bs: int = 64, ctx: int = 4096) -> dict:
    plan = plan_for(GPU, "flashinfer", PS, MLA_MODELS[heads])
    s, pools, q, latent = mla_case([(ctx - 1, 1)] * bs, ForwardMode.DECODE, PS, heads, num_slots=bs * ctx)
    layer = mla_layer(heads, torch.Generator(device="cuda").manual_seed(1))
    fi = flashinfer_backend(plan, pools[0], s.req_to_token_pool.req_to_token, [layer], "cuda")
    fi.init_forward_metadata(s.batch)
    wrapper, pool, loc = fi.mla_wrapper, pools[0], s.batch.out_cache_loc
    paged = pool.kv_buffer[0].view(-1, PS, RANK + ROPE)

    def raw_steps():
        pool.set_kv_buffer(0, loc, latent)
        return project_out(wrapper.run(query=absorb_q(q, layer), kv_cache=paged), layer)

    backend_ms, raw_ms = paired_ms(lambda: fi.forward(q, latent, None, layer, s.batch), raw_steps)
    q_abs = absorb_q(q, layer)
    kernel_ms = cuda_ms(lambda: wrapper.run(query=q_abs, kv_cache=paged))
    latent_bytes = bs * ctx * (RANK + ROPE) * 2
    return {
        "heads": heads,
        "backend_ms": round(backend_ms, 4),
        "raw_steps_ms": round(raw_ms, 4),
        "backend_over_raw": round(backend_ms / raw_ms, 3),
        "kernel_only_ms": round(kernel_ms, 4),
        "kernel_TB_per_s": round(latent_bytes / kernel_ms / 1e9, 2),
        "family": plan.flashinfer.mla_kernel_family,
    }


def prefill(heads: int = 16, bs: int = 4, n: int = 4096) -> dict:
    plan = plan_for(GPU, "flashinfer", PS, MLA_MODELS[heads])
    s, pools, q, latent = mla_case([(0, n)] * bs, ForwardMode.EXTEND, PS, heads, num_slots=bs * n)
    layer = mla_layer(heads, torch.Generator(device="cuda").manual_seed(1))
    fi = flashinfer_backend(plan, pools[0], s.req_to_token_pool.req_to_token, [layer], "cuda")
    fi.init_forward_metadata(s.batch)
    ragged, pool, loc = fi.ragged_wrapper, pools[0], s.batch.out_cache_loc

    def raw_steps():
        pool.set_kv_buffer(0, loc, latent)
        return ragged.run(q, *decompress(latent, layer))

    backend_ms, raw_ms = paired_ms(lambda: fi.forward(q, latent, None, layer, s.batch), raw_steps, iters=10)
    k, v = decompress(latent, layer)
    kernel_ms = cuda_ms(lambda: ragged.run(q, k, v), iters=10)
    flops = bs * heads * (n * n / 2) * 2 * (192 + 128)  # causal: half the scores; QK^T and PV
    return {
        "heads": heads,
        "backend_ms": round(backend_ms, 3),
        "raw_steps_ms": round(raw_ms, 3),
        "backend_over_raw": round(backend_ms / raw_ms, 3),
        "kernel_only_ms": round(kernel_ms, 3),
        "kernel_TFLOP_per_s": round(flops / kernel_ms / 1e9, 1),
        "family": plan.flashinfer.prefill_kernel_family,
    }


if __name__ == "__main__":
    print(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(),
                "decode_64x4096": [decode(16), decode(128)],
                "prefill_4x4096": prefill(),
            },
            indent=2,
        )
    )
