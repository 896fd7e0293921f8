"""Two gloo processes on the CPU: equal plans pass; one differing argument makes both ranks raise; under DP attention
both ranks agree on the batch size to pad to, and the IDLE rank's padded batch runs."""

from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from attngate import (  # noqa: E402
    ForwardMode,  # noqa: E402
    ModelFacts,
    Platform,
    ServerArgs,
    resolve,
)
from attngate.backends.reference import ReferenceBackend  # noqa: E402
from attngate.backends.runtime.batch_builder import build_batch  # noqa: E402
from attngate.backends.runtime.dp_padding import pad_decode_batch  # noqa: E402
from attngate.backends.runtime.kv_cache import MHATokenToKVPool  # noqa: E402
from attngate.backends.runtime.layer import layers_from_model  # noqa: E402
from attngate.integrations.distributed import (  # noqa: E402
    PlanMismatchError,
    check_plan_consistency,
    dp_max_batch_size,
)
from tests.support.helpers import MODELS  # noqa: E402


def _rank(rank: int, init: str, page_sizes: tuple[int, int], results) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
        resolution = resolve(
            ServerArgs(attention_backend="flashinfer", page_size=page_sizes[rank]), facts, Platform.from_name("sm90")
        )
        check_plan_consistency(resolution)
        results[rank] = "ok"
    except PlanMismatchError as err:
        results[rank] = str(err)
    finally:
        dist.destroy_process_group()


def _run(page_sizes: tuple[int, int]) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(f"file://{os.path.join(tmp, 'store')}", page_sizes, results), nprocs=2, join=True)
        return [results[0], results[1]]


def test_equal_plans_pass_on_every_rank():
    assert _run((16, 16)) == ["ok", "ok"]


def test_a_rank_with_another_argument_makes_every_rank_raise_naming_the_gate():
    r0, r1 = _run((16, 1))
    assert r0 == r1  # every rank reports the same problems
    assert "rank 1" in r0 and "common.page_size: 16 on rank 0, 1 on rank 1" in r0 and "page_size: 16 vs 1" in r0


def _dp_rank(rank: int, init: str, results) -> None:
    """Rank 0 decodes 3 requests, rank 1 is IDLE: both pad to 3 and run one decode forward on the plan's reference."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
        resolution = resolve(
            ServerArgs(attention_backend="fa4", page_size=16, tp_size=2, dp_size=2, enable_dp_attention=True),
            facts,
            Platform.from_name("sm90"),
        )
        check_plan_consistency(resolution)
        mode = ForwardMode.DECODE if rank == 0 else ForwardMode.IDLE
        setup = build_batch([(7, 1), (40, 1), (2, 1)], mode, page_size=16, num_slots=1 << 10, max_context_len=64)
        size = dp_max_batch_size(setup.batch.batch_size)
        batch = pad_decode_batch(
            setup.batch, size, padding_row=0, padding_slot=(1 << 10) - 1
        )  # rank 0 pads nothing, rank 1 holds no request
        layers = layers_from_model(facts, resolution.plan)[:1]
        layer = layers[0]
        pool = MHATokenToKVPool(1 << 10, 16, 1, layer.num_kv_heads, layer.head_dim, dtype=torch.float32)
        ref = ReferenceBackend(resolution.plan, pool, setup.req_to_token_pool.req_to_token, layers)
        ref.init_forward_metadata(batch)
        q = torch.randn(size, layer.num_q_heads, layer.head_dim)
        kv = torch.randn(size, layer.num_kv_heads, layer.head_dim)
        results[rank] = (size, tuple(ref.forward(q, kv, kv, layer, batch).shape))
    finally:
        dist.destroy_process_group()


def test_dp_ranks_agree_on_the_padded_batch_size_and_the_idle_rank_runs_it():
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_dp_rank, args=(f"file://{os.path.join(tmp, 'store')}", results), nprocs=2, join=True)
        r0, r1 = results[0], results[1]
    assert r0[0] == r1[0] == 3 and r0[1] == r1[1] and r0[1][0] == 3
