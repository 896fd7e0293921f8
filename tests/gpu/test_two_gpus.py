"""Two GPUs over NCCL: attention TP = 2 through the FA and FlashInfer backends equals the 1-GPU reference after
the all-gather of heads; DP attention with one rank IDLE and the other decoding uneven requests, eager and in
CUDA-graph replay, with scheduler-metadata precompute off as the plan says, in checked mode; the IDLE rank then
pads to the global batch size and runs that decode eager and replayed. Every rank first checks that all ranks
resolved the same plan."""

from __future__ import annotations

import os
import tempfile
import traceback

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("flashinfer")
pytest.importorskip("flash_attn.cute")
if torch.cuda.device_count() < 2:
    pytest.skip("needs two GPUs", allow_module_level=True)

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from attngate import ForwardMode, ModelFacts, Platform, ServerArgs, resolve  # noqa: E402
from attngate.backends.factories import backend_factory  # noqa: E402
from attngate.backends.flashattention import FlashAttentionBackend  # noqa: E402
from attngate.backends.reference import ReferenceBackend  # noqa: E402
from attngate.backends.runtime.batch_builder import build_batch  # noqa: E402
from attngate.backends.runtime.dp_padding import pad_decode_batch  # noqa: E402
from attngate.backends.runtime.kv_cache import MHATokenToKVPool  # noqa: E402
from attngate.backends.runtime.layer import layers_from_model  # noqa: E402
from attngate.integrations.distributed import check_plan_consistency, dp_max_batch_size  # noqa: E402
from tests.support.helpers import MODELS  # noqa: E402

H, HKV, D, DTYPE = 32, 8, 128, torch.bfloat16
REQUESTS = {ForwardMode.EXTEND: [(0, 37), (300, 20), (17, 1)], ForwardMode.DECODE: [(900, 1), (5, 1), (130, 1), (0, 1)]}
BACKENDS = ("fa4", "flashinfer")


def _full_case(mode, page_size):
    """The same batch and full-head tensors on every rank (fixed seeds): prefix K/V, q, new K/V."""
    requests = REQUESTS[mode]
    s = build_batch(requests, mode, page_size=page_size, num_slots=1 << 14, max_context_len=2048, seed=0, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(1)
    k = torch.randn(1 << 14, HKV, D, device="cuda", generator=gen, dtype=DTYPE)
    v = torch.randn(1 << 14, HKV, D, device="cuda", generator=gen, dtype=DTYPE)
    q = torch.randn(s.batch.num_tokens, H, D, device="cuda", generator=gen, dtype=DTYPE)
    return s, k, v, q


def _attend(backend_cls, plan, s, k, v, q, q_heads: slice, kv_heads: slice, layers, checked=False):
    pool = MHATokenToKVPool(
        1 << 14, plan.common.page_size, 1, kv_heads.stop - kv_heads.start, D, dtype=DTYPE, device="cuda"
    )
    loc = s.batch.out_cache_loc
    prefix = torch.cat([slots[:p] for (p, _), slots in zip(REQUESTS[s.batch.forward_mode], s.slots)]).cuda()
    pool.set_kv_buffer(0, prefix, k[prefix][:, kv_heads], v[prefix][:, kv_heads])
    backend = backend_cls(
        plan, pool, s.req_to_token_pool.req_to_token, layers, "cuda", **({"checked": True} if checked else {})
    )
    backend.init_forward_metadata(s.batch)
    return backend.forward(q[:, q_heads], k[loc][:, kv_heads], v[loc][:, kv_heads], layers[0], s.batch)


def _tp_rank(rank: int, backend: str, page_size: int) -> str:
    facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
    gpu = Platform.from_name("sm90")
    resolution = resolve(ServerArgs(attention_backend=backend, page_size=page_size, tp_size=2), facts, gpu)
    check_plan_consistency(resolution)
    plan = resolution.plan
    qh, kvh = plan.common.num_q_heads_per_rank, plan.common.num_kv_heads_per_rank
    assert (plan.common.attn_tp_size, qh, kvh) == (2, 16, 4)
    layers = layers_from_model(facts, plan)[:1]
    one_gpu = resolve(ServerArgs(attention_backend=backend, page_size=page_size), facts, gpu).plan
    # FlashInfer decode only: its SM90 prefill variants take 70 to 100 s each to JIT-build per cold host
    for mode in REQUESTS if backend == "fa4" else [ForwardMode.DECODE]:
        s, k, v, q = _full_case(mode, page_size)
        mine = _attend(
            backend_factory(backend),
            plan,
            s,
            k,
            v,
            q,
            slice(rank * qh, (rank + 1) * qh),
            slice(rank * kvh, (rank + 1) * kvh),
            layers,
        )
        gathered = [torch.empty_like(mine) for _ in range(2)]
        dist.all_gather(gathered, mine.contiguous())
        out = torch.cat(gathered, dim=1)  # heads of rank 0, then rank 1
        expected = _attend(
            ReferenceBackend, one_gpu, s, k, v, q, slice(0, H), slice(0, HKV), layers_from_model(facts)[:1]
        )
        diff = (out.float() - expected.float()).abs().max().item()
        assert diff < 2e-2, f"{backend} page {page_size} {mode.value} rank {rank}: {diff}"
    return "ok"


def _dp_rank(rank: int) -> str:
    """DP attention: every rank holds all heads; rank 1 has no requests and runs IDLE forwards."""
    facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
    resolution = resolve(
        ServerArgs(attention_backend="fa4", page_size=16, tp_size=2, dp_size=2, enable_dp_attention=True),
        facts,
        Platform.from_name("sm90"),
    )
    check_plan_consistency(resolution)
    plan = resolution.plan
    assert plan.common.attn_tp_size == 1 and not plan.fa.precompute_scheduler_metadata
    layers = layers_from_model(facts, plan)[:1]
    mode = ForwardMode.DECODE if rank == 0 else ForwardMode.IDLE
    s, k, v, q = _full_case(ForwardMode.DECODE, 16)
    size = dp_max_batch_size(s.batch.batch_size if rank == 0 else 0)  # every rank pads to the largest batch
    assert size == s.batch.batch_size
    if rank == 1:  # IDLE: no tokens, no metadata, an empty output; padded, a decode batch of the global size
        idle = build_batch(
            [(3, 1)], ForwardMode.IDLE, page_size=16, num_slots=1 << 14, max_context_len=2048, device="cuda"
        )
        pool = MHATokenToKVPool(1 << 14, 16, 1, HKV, D, dtype=DTYPE, device="cuda")
        fa = FlashAttentionBackend(plan, pool, idle.req_to_token_pool.req_to_token, layers, "cuda", checked=True)
        fa.init_forward_metadata(idle.batch)
        assert fa.forward(q[:0], None, None, layers[0], idle.batch).shape == (0, H, D)
        padded = pad_decode_batch(idle.batch, size, padding_row=0, padding_slot=(1 << 14) - 16)
        qp, kp = (
            torch.randn(size, H, D, device="cuda", dtype=DTYPE),
            torch.randn(size, HKV, D, device="cuda", dtype=DTYPE),
        )
        fa.init_forward_metadata(padded)
        eager = fa.forward(qp, kp, kp, layers[0], padded)
        fa.init_cuda_graph_state(size, size)  # and the graph every rank replays at this size
        fa.init_forward_metadata_capture_cuda_graph(
            size, size, padded.req_pool_indices, padded.seq_lens, None, ForwardMode.DECODE
        )
        fa.forward(qp, kp, kp, layers[0], padded)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fa.forward(qp, kp, kp, layers[0], padded)
        fa.init_forward_metadata_replay_cuda_graph(
            size, padded.req_pool_indices, padded.seq_lens, padded.seq_lens_cpu, None, ForwardMode.DECODE
        )
        graph.replay()
        torch.cuda.synchronize()
        assert eager.shape == out.shape == (size, H, D) and bool(torch.isfinite(out.float()).all())
        assert (eager.float() - out.float()).abs().max().item() < 2e-2
    else:
        eager = _attend(FlashAttentionBackend, plan, s, k, v, q, slice(0, H), slice(0, HKV), layers, checked=True)
        expected = _attend(ReferenceBackend, plan, s, k, v, q, slice(0, H), slice(0, HKV), layers)
        assert (eager.float() - expected.float()).abs().max().item() < 2e-2
        # CUDA-graph replay of the same decode batch: captured, then replayed with the metadata refilled
        pool = MHATokenToKVPool(1 << 14, 16, 1, HKV, D, dtype=DTYPE, device="cuda")
        prefix = torch.cat([slots[:p] for (p, _), slots in zip(REQUESTS[ForwardMode.DECODE], s.slots)]).cuda()
        pool.set_kv_buffer(0, prefix, k[prefix], v[prefix])
        fa = FlashAttentionBackend(plan, pool, s.req_to_token_pool.req_to_token, layers, "cuda", checked=True)
        b = s.batch
        fa.init_cuda_graph_state(b.batch_size, b.batch_size)
        fa.init_forward_metadata_capture_cuda_graph(
            b.batch_size, b.batch_size, b.req_pool_indices, b.seq_lens, None, mode
        )
        loc = b.out_cache_loc
        fa.forward(q, k[loc], v[loc], layers[0], b)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fa.forward(q, k[loc], v[loc], layers[0], b)
        fa.init_forward_metadata_replay_cuda_graph(
            b.batch_size, b.req_pool_indices, b.seq_lens, b.seq_lens_cpu, None, mode
        )
        assert fa.md.scheduler_metadata is None  # the plan: no precompute under DP attention
        graph.replay()
        assert (out.float() - expected.float()).abs().max().item() < 2e-2
    dist.barrier()
    return "ok"


def _worker(rank: int, init: str, job, results) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    try:
        results[rank] = job[0](rank, *job[1:])
    except Exception:  # noqa: BLE001 - reported by the parent
        results[rank] = traceback.format_exc()
    finally:
        dist.destroy_process_group()


def _spawn(*job) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(f"file://{os.path.join(tmp, 'store')}", job, results), nprocs=2, join=True)
        return [results.get(0, "no result"), results.get(1, "no result")]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_tp2_equals_the_one_gpu_reference(backend, page_size):
    assert _spawn(_tp_rank, backend, page_size) == ["ok", "ok"]


def test_dp_attention_with_an_idle_rank_eager_and_replayed():
    assert _spawn(_dp_rank) == ["ok", "ok"]
