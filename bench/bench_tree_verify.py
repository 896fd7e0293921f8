"""Speculative tree verify on the FlashInfer backend (EAGLE topk 4, 8 draft tokens); prints one JSON object.

Per batch size (8 and 64 requests with 4088 cached tokens each; Llama 32/8 heads x 128, bf16, page_size 16):
- GPU time of one layer's verify forward (KV write of the draft tokens + paged attention under the tree mask) against
  the pool's KV write plus the raw run() of the same planned wrapper, paired rounds;
- GPU time of building the custom mask (``FlashInferBackend._tree_mask``: the tree spread over each request's KV range);
- host time of the per-batch metadata under the tree plan, under a chain plan of the same 8 draft tokens (no mask),
  and of the raw plan() with prebuilt arguments and a prebuilt mask, timed in the same rounds.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from common import cuda_ms, paired_host_us, paired_ms  # noqa: E402

from attngate import ForwardMode, LayerKind  # noqa: E402
from attngate.backends.flashinfer import FlashInferBackend  # noqa: E402
from attngate.backends.page_ids import page_ids  # noqa: E402
from attngate.backends.runtime.batch_metadata import BatchLengths, host  # noqa: E402
from tests.support.backend_cases import (  # noqa: E402
    GPU,
    SPECULATIVE_TREE,
    layer_of,
    make_case,
    plan_for,
    random_tree,
)

PS, DRAFT, PREFIX = 16, 8, 4088
CHAIN = dict(
    speculative_algorithm="EAGLE", speculative_eagle_topk=1, speculative_num_steps=7, speculative_num_draft_tokens=DRAFT
)


def main() -> None:
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    tree_plan, chain_plan = (
        plan_for(GPU, "flashinfer", PS, **SPECULATIVE_TREE),
        plan_for(GPU, "flashinfer", PS, **CHAIN),
    )
    layer = layer_of(GPU, LayerKind.FULL)
    for bs in (8, 64):
        case = make_case(
            GPU,
            [(PREFIX, DRAFT)] * bs,
            ForwardMode.TARGET_VERIFY,
            PS,
            num_slots=bs * (PREFIX + DRAFT + PS),
            max_context_len=PREFIX + 2 * PS,
        )
        batch, pool, rtt = case.setup.batch, case.pools[0], case.setup.req_to_token_pool.req_to_token
        batch.spec_tree_mask = random_tree(bs, DRAFT, seed=bs, device="cuda")
        fi = FlashInferBackend(tree_plan, pool, rtt, [layer], "cuda")
        chain = FlashInferBackend(chain_plan, pool, rtt, [layer], "cuda")
        fi.init_forward_metadata(batch)
        forward = lambda: fi.forward(case.q, case.k, case.v, layer, batch)  # noqa: E731
        caches = fi.paged_kv(layer.layer_id)

        def raw_step(caches=caches):
            pool.set_kv_buffer(0, batch.out_cache_loc, case.k, case.v)
            return fi.wrappers.paged[0].run(case.q, caches)

        t_b, t_r = paired_ms(forward, raw_step)
        lens = BatchLengths.from_batch(batch)
        spec = fi.specs[0]
        rng = lens.kv_pages(PS)
        mask_ms = cuda_ms(lambda: fi._tree_mask(rng, batch.spec_tree_mask))
        mask = fi._tree_mask(rng, batch.spec_tree_mask)
        args = (
            host(lens.qo_indptr),
            host(rng.indptr),
            page_ids(rtt, batch.req_pool_indices, rng, PS),
            host(rng.last_page_len),
            *spec.heads,
            PS,
        )
        kw = fi.planner.plan_kwargs(spec, "paged") | dict(custom_mask=mask)
        chain_batch = replace(batch, spec_tree_mask=None)
        host_us = paired_host_us(
            {
                "tree_metadata": lambda: fi.init_forward_metadata(batch),
                "chain_metadata": lambda: chain.init_forward_metadata(chain_batch),
                "raw_plan_with_mask": lambda: fi.wrappers.paged[0].plan(*args, causal=False, **kw),
            }
        )
        fi.init_forward_metadata(batch)  # the timed raw plan() replaced the backend's
        out[f"verify_{bs}x{PREFIX + DRAFT}"] = {
            "backend_ms": round(t_b, 4),
            "raw_kv_write_plus_run_ms": round(t_r, 4),
            "backend_over_raw": round(t_b / t_r, 3),
            "tree_mask_build_gpu_ms": round(mask_ms, 4),
            "mask_entries": int(mask.numel()),
            **{f"{k}_host_us": round(v, 1) for k, v in host_us.items()},
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
