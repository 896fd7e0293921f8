"""Host time per decode step and backend/raw kernel ratio over batch size, FlashInfer and FA side by side;
prints one JSON object (run on the device; bench/plot.py draws it).

Each backend call is timed in the same rounds as the raw call it is compared with
(common.paired_host_us), since host time on a shared machine drifts by 30 % within a run.
For every batch size (decode, 2048 cached tokens per request; 32/8 heads, head_dim 128, bf16):
- FlashInfer (page 16): ``init_forward_metadata`` against the raw ``plan()`` it makes, called with the
  same arguments prebuilt (and by a wrapper left on FlashInfer's "auto" decode family, on fresh host
  arrays, on arrays copied into fixed ones, and after the backend's host length work); CUDA-graph
  ``init_forward_metadata_replay_cuda_graph`` against the raw ``plan()`` of the captured wrapper, handed the
  view of its static page ids that the backend hands it, and against the raw ``fast_decode_plan`` (what
  flashinfer.graph_decode_replan runs) with the one copy into the static buffers it leaves to its caller; the
  same replay hook on a backend whose plan says ``plan``; ``forward`` alone; GPU time of ``forward`` against
  raw ``run()``.
- FlashInfer at page 1 (the resolved default, where flashinfer.eager_decode_replan is fast_decode_plan):
  ``init_forward_metadata`` against the same on a backend whose plan says ``plan``, the raw ``plan()`` and the raw
  ``fast_decode_plan`` handed device ranges.
- FA (page 128): ``init_forward_metadata`` + ``forward`` against the raw kernel call on prebuilt
  metadata, and against the raw call plus the raw KV write (two ``index_copy_``), and the parts
  (metadata alone, the pool's KV write alone); GPU time of ``forward`` against the raw call.
- page ids: the Triton kernel against the torch ops that replace it off CUDA.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_flashattention import backend_and_raw as fa_backend_and_raw  # noqa: E402
from bench_flashinfer import decode_plan_args, host_length_work  # noqa: E402
from bench_flashinfer import setup as flashinfer_setup
from common import decode_graph_replay, host_us, paired_host_us, paired_ms  # noqa: E402

from attngate import ForwardMode  # noqa: E402
from attngate.backends import page_ids as page_id_ops  # noqa: E402
from attngate.backends.page_ids import page_ids  # noqa: E402
from attngate.backends.runtime.batch_metadata import BatchLengths, host  # noqa: E402
from tests.support.backend_cases import GPU, make_case, plan_for, with_gate  # noqa: E402

H, HKV, D = GPU.heads
CACHED = 2047
BATCH_SIZES = (1, 8, 64, 256)
DECODE = [(CACHED, 1)]  # one request


def flashinfer_row(bs: int, plan) -> dict:
    fi, case, layer, forward = flashinfer_setup(DECODE * bs, ForwardMode.DECODE, plan)  # page 16
    batch, ps = case.setup.batch, fi.page_size
    spec, wrapper = fi.specs[0], fi.wrappers.decode[0]
    rng, args = decode_plan_args(fi, batch)
    replay = decode_graph_replay(fi, case, layer, bs)
    graph = fi.graphs.captured(ForwardMode.DECODE, bs)
    graph_wrapper = graph.wrappers[0]
    # what the backend hands the captured wrapper: a view of its static page ids, which the graph itself fills
    graph_args = (args[0], graph.ids[0].kv_indices[: rng.total_pages], *args[2:])
    packed, static_packed = host(rng.packed), graph.ids[0].packed
    fast_args = (
        args[0],
        graph.ids[0].kv_indices,
        *args[2:],
    )  # the backend's fast_decode_plan gets the whole static buffer
    graph_kw = fi.planner.plan_kwargs(spec, "decode", cuda_graph=True)
    # the same backend and graph, its plan saying plan() (flashinfer.graph_decode_replan before its rule)
    by_plan = with_gate(plan, "flashinfer.graph_decode_replan", "plan")
    fi_by_plan, case_by_plan, layer_by_plan, _ = flashinfer_setup(DECODE * bs, ForwardMode.DECODE, by_plan)
    decode_graph_replay(fi_by_plan, case_by_plan, layer_by_plan, bs)
    batch_by_plan = case_by_plan.setup.batch
    # the same wrapper left on FlashInfer's "auto" (what the backend built before flashinfer.decode_kernel_family)
    auto = fi.fi.BatchDecodeWithPagedKVCacheWrapper(
        fi.wrappers.workspace, "NHD", use_tensor_cores=fi.plan.flashinfer.decode_use_tensor_cores
    )
    fixed = (rng.indptr.copy(), rng.last_page_len.copy())
    fixed_t = tuple(host(f) for f in fixed)

    lengths = functools.partial(host_length_work, batch, ps)

    fi.init_forward_metadata(batch)  # the eager wrappers again, for forward()
    caches = fi.paged_kv(layer.layer_id)
    row = paired_host_us(
        {
            "eager_metadata": lambda: fi.init_forward_metadata(batch),
            "raw_plan": lambda: wrapper.plan(*args, **fi.planner.plan_kwargs(spec, "decode")),
            # the same call on fresh host arrays, as every step's plan() gets: is the prebuilt-argument baseline favoured?
            "raw_plan_fresh_arrays": lambda: wrapper.plan(
                host(rng.indptr.copy()),
                args[1],
                host(rng.last_page_len.copy()),
                *args[3:],
                **fi.planner.plan_kwargs(spec, "decode"),
            ),
            "raw_plan_arrays_copied_into_fixed_ones": lambda: (
                np.copyto(fixed[0], rng.indptr),
                np.copyto(fixed[1], rng.last_page_len),
                wrapper.plan(fixed_t[0], args[1], fixed_t[1], *args[3:], **fi.planner.plan_kwargs(spec, "decode")),
            ),
            "lengths_then_raw_plan": lambda: (lengths(), wrapper.plan(*args, **fi.planner.plan_kwargs(spec, "decode"))),
            "lengths": lengths,
            "replay_replan": lambda: fi.init_forward_metadata_replay_cuda_graph(
                bs, batch.req_pool_indices, batch.seq_lens, batch.seq_lens_cpu, None, ForwardMode.DECODE
            ),
            "raw_graph_plan": lambda: graph_wrapper.plan(*graph_args, **graph_kw),
            "raw_graph_fast_plan": lambda: (
                static_packed.copy_(packed, non_blocking=True),
                fi.fi.fast_decode_plan(graph_wrapper, *fast_args, global_override_indptr_cpu=args[0], **graph_kw),
            ),
            "replay_replan_by_plan": lambda: fi_by_plan.init_forward_metadata_replay_cuda_graph(
                bs,
                batch_by_plan.req_pool_indices,
                batch_by_plan.seq_lens,
                batch_by_plan.seq_lens_cpu,
                None,
                ForwardMode.DECODE,
            ),
            "raw_plan_auto_family": lambda: auto.plan(*args, **fi.planner.plan_kwargs(spec, "decode")),
            "replay_step": replay,
        }
    )
    fi.init_forward_metadata(batch)
    row |= paired_host_us({"forward_only": forward, "raw_run": lambda: wrapper.run(case.q, caches)})
    t_b, t_r = paired_ms(forward, lambda: wrapper.run(case.q, caches))
    row |= {"gpu_forward_ms": t_b, "gpu_raw_run_ms": t_r}
    return {k: round(v, 4 if k.startswith("gpu") else 1) for k, v in row.items()}


def flashinfer_page1_row(bs: int, plan) -> dict:
    fi, case, _, _ = flashinfer_setup(DECODE * bs, ForwardMode.DECODE, plan, page_size=1)
    by_plan = with_gate(plan, "flashinfer.eager_decode_replan", "plan")
    fi_by_plan, case_by_plan, _, _ = flashinfer_setup(DECODE * bs, ForwardMode.DECODE, by_plan, page_size=1)
    batch, batch_by_plan, spec, wrapper = case.setup.batch, case_by_plan.setup.batch, fi.specs[0], fi.wrappers.decode[0]
    rng, args = decode_plan_args(fi, batch)
    packed = page_id_ops.device_ranges(rng, "cuda")
    fast_args = (packed[: bs + 1], args[1], packed[2 * bs + 1 :], *args[3:])
    kw = fi.planner.plan_kwargs(spec, "decode")
    row = paired_host_us(
        {
            "eager_metadata": lambda: fi.init_forward_metadata(batch),
            "eager_metadata_by_plan": lambda: fi_by_plan.init_forward_metadata(batch_by_plan),
            "raw_plan": lambda: wrapper.plan(*args, **kw),
            "raw_fast_plan": lambda: fi.fi.fast_decode_plan(
                wrapper, *fast_args, global_override_indptr_cpu=args[0], **kw
            ),
        }
    )
    return {k: round(v, 1) for k, v in row.items()}


def fa_row(bs: int, plan) -> dict:
    fa, case, layer, eager, raw, forward = fa_backend_and_raw(DECODE * bs, ForwardMode.DECODE, plan)  # page 128
    batch, pool = case.setup.batch, case.pools[0]
    k_words, v_words = pool._k_words[0], pool._v_words[0]  # the raw write: two index_copy_ on the pool's word views
    k_src, v_src, loc = case.k.view(torch.int64), case.v.view(torch.int64), batch.out_cache_loc
    row = paired_host_us(
        {
            "eager_step": eager,
            "raw_call": raw,
            "raw_write_and_call": lambda: (
                k_words.index_copy_(0, loc, k_src),
                v_words.index_copy_(0, loc, v_src),
                raw(),
            ),
            "eager_metadata": lambda: fa.init_forward_metadata(batch),
            "kv_write": lambda: pool.set_kv_buffer(0, loc, case.k, case.v),
        }
    )
    fa.init_forward_metadata(batch)
    row |= paired_host_us({"forward_only": forward, "raw_call_again": raw})
    t_b, t_r = paired_ms(forward, raw)
    row |= {"gpu_forward_ms": t_b, "gpu_raw_ms": t_r, "replay_step": host_us(decode_graph_replay(fa, case, layer, bs))}
    return {k: round(v, 4 if k.startswith("gpu") else 1) for k, v in row.items()}


def page_id_row(bs: int) -> dict:
    case = make_case(
        GPU,
        DECODE * bs,
        ForwardMode.DECODE,
        16,
        num_slots=bs * (CACHED + 17) // 16 * 16 + 16,
        max_context_len=CACHED + 17,
    )
    lens = BatchLengths.from_batch(case.setup.batch)
    rng, rtt = lens.kv_pages(16), case.setup.req_to_token_pool.req_to_token
    triton_ids = page_ids(rtt, lens.rows, rng, 16)
    launcher = page_id_ops._TRITON[:]
    page_id_ops._TRITON[:] = [None]  # the torch ops that run off CUDA
    try:
        torch_ids = page_ids(rtt, lens.rows, rng, 16)
    finally:
        page_id_ops._TRITON[:] = launcher
    assert torch.equal(triton_ids, torch_ids)

    def torch_ops():
        page_id_ops._TRITON[:] = [None]
        page_ids(rtt, lens.rows, rng, 16)
        page_id_ops._TRITON[:] = launcher

    times = paired_host_us({"triton": lambda: page_ids(rtt, lens.rows, rng, 16), "torch_ops": torch_ops})
    return {k: round(v, 1) for k, v in times.items()} | {"triton_available": launcher[0] is not None}


def main() -> None:
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cached_tokens": CACHED + 1}
    fi_plan, fa_plan = plan_for(GPU, "flashinfer", 16), plan_for(GPU, page_size=128)
    out["page_ids_us"] = {bs: page_id_row(bs) for bs in BATCH_SIZES}
    out["flashinfer_us"] = {bs: flashinfer_row(bs, fi_plan) for bs in BATCH_SIZES}
    out["flashinfer_page1_us"] = {bs: flashinfer_page1_row(bs, plan_for(GPU, "flashinfer", 1)) for bs in BATCH_SIZES}
    out["fa_us"] = {bs: fa_row(bs, fa_plan) for bs in BATCH_SIZES}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
