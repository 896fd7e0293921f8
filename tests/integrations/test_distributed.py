"""Two gloo processes on the CPU: equal plans pass; one differing argument makes both ranks raise."""

from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from attngate import ModelFacts, Platform, ServerArgs, resolve  # noqa: E402
from attngate.integrations.distributed import PlanMismatchError, check_plan_consistency  # noqa: E402
from helpers import MODELS  # noqa: E402


def _rank(rank: int, init: str, page_sizes: tuple[int, int], results) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
        resolution = resolve(ServerArgs(attention_backend="flashinfer", page_size=page_sizes[rank]), facts, Platform.from_name("sm90"))
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
