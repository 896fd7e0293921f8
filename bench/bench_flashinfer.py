"""FlashInfer backend benchmarks on the GPU; prints one JSON object (run on the device).

- decode 64 x 4096 (32/8 heads, head_dim 128, bf16, page_size 16): KV bytes per second through the
  backend's forward and through the raw BatchDecodeWithPagedKVCacheWrapper.run of the same plan, and the
  forward against the pool's KV write plus run() (the forward writes the new token's K/V first);
- causal prefill 8 x 4096: TFLOP/s through the backend and through the raw ragged wrapper's run;
- deterministic mode (fixed split sizes, tensor-core decode, no ragged) against the default mode;
- prefill also split: attention alone (save_kv_cache=False) against run(), and forward against run() plus the KV write;
  host time per step: bench/bench_host.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from attngate import ForwardMode, LayerKind  # noqa: E402
from attngate.backends.flashinfer import FlashInferBackend  # noqa: E402
from tests.support.backend_cases import GPU, layer_of, make_case, plan_for  # noqa: E402

H, HKV, D = GPU.heads
from common import paired_ms  # noqa: E402

PS = 16


def setup(requests, mode, plan, page_size: int = PS):
    layer = layer_of(GPU, LayerKind.FULL)
    longest = max(p + n for p, n in requests)
    ps = page_size
    case = make_case(
        GPU, requests, mode, ps, num_slots=len(requests) * (longest + ps) // ps * ps + ps, max_context_len=longest + ps
    )
    fi = FlashInferBackend(plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], "cuda")
    batch = case.setup.batch
    fi.init_forward_metadata(batch)
    forward = lambda: fi.forward(case.q, case.k, case.v, layer, batch)  # noqa: E731
    forward()
    return fi, case, layer, forward


def decode_plan_args(fi: FlashInferBackend, batch):
    """The page ranges of a decode batch and the positional plan() arguments the backend's wrapper 0 gets for it,
    prebuilt: what the benches call the raw ``plan()`` with."""
    from attngate.backends.page_ids import page_ids
    from attngate.backends.runtime.batch_metadata import BatchLengths, host

    rng = BatchLengths.from_batch(batch).kv_pages(fi.page_size)
    ids = page_ids(fi.req_to_token, batch.req_pool_indices, rng, fi.page_size)
    return rng, (host(rng.indptr), ids, host(rng.last_page_len), *fi.specs[0].heads, fi.page_size)


def host_length_work(batch, page_size: int):
    """The backend's host-side work before a decode plan(): lengths, page ranges, the host tensors plan() gets."""
    from attngate.backends.runtime.batch_metadata import BatchLengths, host

    r = BatchLengths.from_batch(batch).kv_pages(page_size)
    return host(r.indptr), host(r.last_page_len)


def main() -> None:
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    default, det = plan_for(GPU, "flashinfer", PS), plan_for(GPU, "flashinfer", PS, enable_deterministic_inference=True)
    kv_bytes = 64 * 4096 * HKV * D * 2 * 2
    flops = 8 * 4 * H * D * 4096 * 4096 / 2
    for name, plan in (("default", default), ("deterministic", det)):
        fi, case, layer, forward = setup([(4095, 1)] * 64, ForwardMode.DECODE, plan)
        caches, batch, pool = fi.paged_kv(layer.layer_id), case.setup.batch, case.pools[0]
        raw = lambda: fi._active_decode[0].run(case.q, caches)  # noqa: E731
        raw_step = lambda: (pool.set_kv_buffer(0, batch.out_cache_loc, case.k, case.v), raw())  # noqa: E731  write the new token, attend
        t_b, t_r = paired_ms(forward, raw)
        t_b2, t_s = paired_ms(forward, raw_step)
        out[f"decode_64x4096_{name}"] = {
            "backend_ms": round(t_b, 4),
            "raw_run_ms": round(t_r, 4),
            "backend_TBps": round(kv_bytes / t_b / 1e9, 3),
            "raw_TBps": round(kv_bytes / t_r / 1e9, 3),
            "backend_over_raw": round(t_b / t_r, 3),
            "raw_kv_write_plus_run_ms": round(t_s, 4),
            "backend_over_raw_kv_write_plus_run": round(t_b2 / t_s, 3),
        }
        fi, case, layer, forward = setup([(0, 4096)] * 8, ForwardMode.EXTEND, plan)
        batch, pool = case.setup.batch, case.pools[0]
        write = lambda: pool.set_kv_buffer(0, batch.out_cache_loc, case.k, case.v)  # noqa: E731
        if fi._batch_path == "ragged":
            run = lambda: fi.wrappers.ragged[0].run(case.q, case.k, case.v)  # noqa: E731
            raw = lambda: (run(), write())  # noqa: E731  what a server must do at the least: attend and write the new K/V
            attention_only = lambda: fi.forward(case.q, case.k, case.v, layer, batch, save_kv_cache=False)  # noqa: E731
        else:  # the paged path reads what it writes: the write is part of the raw step too
            caches = fi.paged_kv(layer.layer_id)
            run = lambda: fi._active_paged[0].run(case.q, caches)  # noqa: E731
            raw = lambda: (write(), run())  # noqa: E731
            attention_only = None
        t_b, t_r = paired_ms(forward, raw, iters=10)
        row = {
            "path": fi._batch_path,
            "backend_ms": round(t_b, 3),
            "raw_run_plus_kv_write_ms": round(t_r, 3),
            "backend_TFLOPs": round(flops / t_b / 1e9, 1),
            "backend_over_raw": round(t_b / t_r, 3),
        }
        if attention_only is not None:
            t_a, t_run = paired_ms(attention_only, run, iters=10)
            row |= {
                "backend_attention_only_ms": round(t_a, 3),
                "raw_run_ms": round(t_run, 3),
                "backend_attention_TFLOPs": round(flops / t_a / 1e9, 1),
                "raw_run_TFLOPs": round(flops / t_run / 1e9, 1),
                "attention_backend_over_raw": round(t_a / t_run, 3),
            }
        out[f"prefill_8x4096_causal_{name}"] = row
    for kind in ("decode_64x4096", "prefill_8x4096_causal"):
        out[f"{kind}_deterministic_over_default"] = round(
            out[f"{kind}_deterministic"]["backend_ms"] / out[f"{kind}_default"]["backend_ms"], 3
        )

    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
