"""Two gloo processes on the CPU: equal plans pass; one differing argument makes both ranks raise; under DP attention
both ranks agree on the batch size to pad to, and the IDLE rank's padded batch runs; a bad argument on one rank fails
both ranks with the UsageError naming that rank and argument, never a transport error or a hang."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

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


#: what rank 1 passes in each round of _bad_argument_rank (rank 0 passes good arguments throughout)
BAD_ARGUMENTS = {
    "no plan": lambda resolution: check_plan_consistency(None),
    "a string": lambda resolution: check_plan_consistency("fa3"),
    "a group that is a string": lambda resolution: check_plan_consistency(resolution, group="world"),
    "a negative batch size": lambda resolution: dp_max_batch_size(-1),
}


def _bad_argument_rank(rank: int, init: str, results) -> None:
    """Round by round, rank 1 passes one bad argument while rank 0 passes good ones; a last round of good arguments
    on both shows the group still in step."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
        resolution = resolve(ServerArgs(attention_backend="flashinfer"), facts, Platform.from_name("sm90"))
        for name, bad in BAD_ARGUMENTS.items():
            good = (lambda r: dp_max_batch_size(3)) if "batch" in name else check_plan_consistency
            call = bad if rank == 1 else good
            try:
                call(resolution)
                results[(rank, name)] = "passed"
            except Exception as err:  # noqa: BLE001 - the test compares what each rank raised
                results[(rank, name)] = (type(err).__name__, [p.where for p in getattr(err, "problems", [])], str(err))
        check_plan_consistency(resolution)
        results[(rank, "after")] = "ok"
    finally:
        dist.destroy_process_group()


def test_a_bad_argument_on_one_rank_fails_every_rank_with_usage_error_naming_it():
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_bad_argument_rank, args=(f"file://{os.path.join(tmp, 'store')}", results), nprocs=2, join=True)
        results = dict(results)
    wheres = {
        "no plan": ["rank 1: plan_or_resolution"],
        "a string": ["rank 1: plan_or_resolution"],
        "a group that is a string": ["rank 1: group"],
    }
    for name, expected in wheres.items():
        r0, r1 = results[(0, name)], results[(1, name)]
        assert r0 == r1, name  # every rank raises the same error
        assert r0[0] == "UsageError" and r0[1] == expected, (name, r0)
    r0, r1 = results[(0, "a negative batch size")], results[(1, "a negative batch size")]
    assert r0[:2] == ("UsageError", ["rank 1"]) and r1[:2] == ("UsageError", ["rank 1: batch_size"]), (r0, r1)
    assert "plan_or_resolution: takes Plan or Resolution, not None" in results[(0, "no plan")][2]
    assert results[(0, "after")] == results[(1, "after")] == "ok"


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
