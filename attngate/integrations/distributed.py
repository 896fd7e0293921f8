"""One plan across ranks: compare plan fingerprints over ``torch.distributed`` before the first forward.

Every rank of a server resolves its own plan. If one rank's arguments, model files or installed
kernels differ, its plan differs and the ranks silently run different attention; this check turns
that into an error on every rank. It lives under ``integrations/`` because it imports torch::

    from attngate.integrations.distributed import check_plan_consistency
    check_plan_consistency(resolution)        # after torch.distributed.init_process_group(...)

Under DP attention it also gives every rank the batch size to pad to (:func:`dp_max_batch_size`).
"""

from __future__ import annotations

from typing import Any

from attngate.engine.result import Resolution
from attngate.errors import AttngateError, Problem
from attngate.facts.catalogue import base_facts
from attngate.plan.compare import differing, gate_values
from attngate.plan.schema import Plan


class PlanMismatchError(AttngateError):
    title = "ranks resolved different attention plans"


def check_plan_consistency(plan_or_resolution: Plan | Resolution, group: Any = None) -> None:
    """Raise :class:`PlanMismatchError` on every rank unless all ranks of ``group`` hold the same plan.

    Cheap when they agree: one all-gather of the 64-character fingerprints. On a mismatch the plans
    (and, given a Resolution, the facts they were resolved from) are gathered, and the error lists,
    for every rank that differs from rank 0, each differing gate with both values and each differing
    fact. Works over any backend (gloo on CPU, NCCL on GPU). Raises RuntimeError when
    torch.distributed is not initialized.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("check_plan_consistency needs torch.distributed.init_process_group() first")
    resolution = plan_or_resolution if isinstance(plan_or_resolution, Resolution) else None
    plan = resolution.plan if resolution else plan_or_resolution
    world = dist.get_world_size(group)
    fingerprints: list[Any] = [None] * world
    dist.all_gather_object(fingerprints, plan.fingerprint, group=group)
    if len(set(fingerprints)) == 1:
        return
    mine = {
        "gates": gate_values(plan),
        "facts": base_facts(resolution.server_args, resolution.model, resolution.platform) if resolution else {},
    }
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine, group=group)
    problems = []
    for rank, theirs in enumerate(everyone):
        if fingerprints[rank] == fingerprints[0]:
            continue
        gates = differing(everyone[0]["gates"], theirs["gates"])
        facts = differing(everyone[0]["facts"], theirs["facts"]) if everyone[0]["facts"] and theirs["facts"] else {}
        text = "; ".join(f"{k}: {a!r} on rank 0, {b!r} on rank {rank}" for k, (a, b) in gates.items())
        if facts:
            text += " -- facts behind them: " + "; ".join(f"{k}: {a!r} vs {b!r}" for k, (a, b) in facts.items())
        problems.append(Problem(f"rank {rank}", text))
    raise PlanMismatchError(problems)


def dp_max_batch_size(batch_size: int, group: Any = None) -> int:
    """The largest decode batch size of any rank of ``group`` (one all-reduce of one integer): what every DP-attention
    rank pads its batch to with :func:`attngate.backends.runtime.dp_padding.pad_decode_batch`, so that all ranks run the
    same number of tokens and replay the same CUDA graph. An IDLE rank passes 0. Works over gloo and NCCL (NCCL
    reduces on the current CUDA device). Raises RuntimeError when torch.distributed is not initialized."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("dp_max_batch_size needs torch.distributed.init_process_group() first")
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    )
    size = torch.tensor([batch_size], dtype=torch.int64, device=device)
    dist.all_reduce(size, op=dist.ReduceOp.MAX, group=group)
    return int(size.item())
