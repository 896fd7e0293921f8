"""FlashInfer backend benchmarks on the GPU; prints one JSON object (run on the device).

- decode 64 x 4096 (32/8 heads, head_dim 128, bf16, page_size 16): KV bytes per second through the
  backend's forward and through the raw BatchDecodeWithPagedKVCacheWrapper.run of the same plan;
- causal prefill 8 x 4096: TFLOP/s through the backend and through the raw ragged wrapper's run;
- deterministic mode (fixed split sizes, tensor-core decode, no ragged) against the default mode;
- per-step host time of init_forward_metadata + forward at batch 1 and 64, eager and CUDA-graph replay.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from attngate import ForwardMode, LayerKind  # noqa: E402
from attngate.backends.flashinfer import FlashInferBackend  # noqa: E402
from backend_cases import GPU, layer_of, make_case, plan_for  # noqa: E402

H, HKV, D = GPU.heads
from common import decode_graph_replay, host_us, paired_ms  # noqa: E402

PS = 16


def setup(requests, mode, plan):
    layer = layer_of(GPU, LayerKind.FULL)
    longest = max(p + n for p, n in requests)
    case = make_case(GPU, requests, mode, PS, num_slots=len(requests) * (longest + PS) // PS * PS + PS, max_context_len=longest + PS)
    fi = FlashInferBackend(plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], "cuda")
    batch = case.setup.batch
    fi.init_forward_metadata(batch)
    forward = lambda: fi.forward(case.q, case.k, case.v, layer, batch)  # noqa: E731
    forward()
    return fi, case, layer, forward


def main() -> None:
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    default, det = plan_for(GPU, "flashinfer", PS), plan_for(GPU, "flashinfer", PS, enable_deterministic_inference=True)
    kv_bytes = 64 * 4096 * HKV * D * 2 * 2
    flops = 8 * 4 * H * D * 4096 * 4096 / 2
    for name, plan in (("default", default), ("deterministic", det)):
        fi, case, layer, forward = setup([(4095, 1)] * 64, ForwardMode.DECODE, plan)
        caches = fi._caches(layer)
        raw = lambda: fi._active_decode[0].run(case.q, caches)  # noqa: E731
        t_b, t_r = paired_ms(forward, raw)
        out[f"decode_64x4096_{name}"] = {"backend_ms": round(t_b, 4), "raw_run_ms": round(t_r, 4),
                                         "backend_TBps": round(kv_bytes / t_b / 1e9, 3), "raw_TBps": round(kv_bytes / t_r / 1e9, 3),
                                         "backend_over_raw": round(t_b / t_r, 3)}
        fi, case, layer, forward = setup([(0, 4096)] * 8, ForwardMode.EXTEND, plan)
        if fi._batch_path == "ragged":
            raw = lambda: fi.ragged_wrappers[0].run(case.q, case.k, case.v)  # noqa: E731
        else:
            caches = fi._caches(layer)
            raw = lambda: fi._active_paged[0].run(case.q, caches)  # noqa: E731
        t_b, t_r = paired_ms(forward, raw, iters=10)
        out[f"prefill_8x4096_causal_{name}"] = {"path": fi._batch_path, "backend_ms": round(t_b, 3), "raw_run_ms": round(t_r, 3),
                                                "backend_TFLOPs": round(flops / t_b / 1e9, 1), "raw_TFLOPs": round(flops / t_r / 1e9, 1),
                                                "backend_over_raw": round(t_b / t_r, 3)}
    for kind in ("decode_64x4096", "prefill_8x4096_causal"):
        out[f"{kind}_deterministic_over_default"] = round(out[f"{kind}_deterministic"]["backend_ms"] / out[f"{kind}_default"]["backend_ms"], 3)

    for bs in (1, 64):
        fi, case, layer, forward = setup([(4095, 1)] * bs, ForwardMode.DECODE, default)
        batch = case.setup.batch

        def eager_step():
            fi.init_forward_metadata(batch)
            return fi.forward(case.q, case.k, case.v, layer, batch)

        replay = decode_graph_replay(fi, case, layer, bs)
        out[f"host_us_decode_bs{bs}"] = {"eager_metadata_plus_forward": round(host_us(eager_step), 1),
                                         "eager_forward_only": round(host_us(forward), 1),
                                         "replay_incl_replan": round(host_us(replay), 1)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
