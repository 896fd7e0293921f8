"""One plan across ranks: compare plan fingerprints over ``torch.distributed`` before the first forward.

Every rank of a server resolves its own plan. If one rank's arguments, model files or installed
kernels differ, its plan differs and the ranks silently run different attention; this check turns
that into an error on every rank. It lives under ``integrations/`` because it imports torch::

    from attngate.integrations.distributed import check_plan_consistency
    check_plan_consistency(resolution)        # after torch.distributed.init_process_group(...)

Under DP attention it also gives every rank the batch size to pad to (:func:`dp_max_batch_size`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attngate.engine.result import Resolution
from attngate.errors import PlanMismatchError, Problem, UsageError, argument_problems, count_problems
from attngate.facts.catalogue import base_facts
from attngate.plan.compare import differing, gate_values
from attngate.plan.schema import Plan

__all__ = ["PlanMismatchError", "check_plan_consistency", "dp_max_batch_size"]  # the error lives in attngate.errors


def check_plan_consistency(plan_or_resolution: Plan | Resolution, group: Any = None) -> None:
    """Raise :class:`PlanMismatchError` on every rank unless all ranks of ``group`` hold the same plan.

    Cheap when they agree: one all-gather of the 64-character fingerprints. On a mismatch the plans
    (and, given a Resolution, the facts they were resolved from) are gathered, and the error lists,
    for every rank that differs from rank 0, each differing gate with both values and each differing
    fact. Works over any backend (gloo on CPU, NCCL on GPU).

    The arguments are checked before any collective, and the first all-gather carries each rank's verdict on its
    own: where any rank was given something else than a Plan or a Resolution, or a ``group`` that is no
    ProcessGroup (its exchange then runs on the default group), every rank raises one UsageError naming each bad
    rank and argument, instead of the others waiting for it or meeting a closed connection. A rank outside
    ``group`` raises UsageError alone (the group's members do not wait for it). Raises RuntimeError when
    torch.distributed is not initialized.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("check_plan_consistency needs torch.distributed.init_process_group() first")
    group = _group_of(dist, group, "check_plan_consistency")
    problems = argument_problems(
        ("plan_or_resolution", plan_or_resolution, (Plan, Resolution), "attngate.resolve(...) or its .plan")
    )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        problems.append(_bad_group(group))
        group = None
    resolution = plan_or_resolution if isinstance(plan_or_resolution, Resolution) else None
    plan = resolution.plan if resolution else plan_or_resolution
    world = dist.get_world_size(group)
    verdicts: list[Any] = [None] * world
    own = ("bad", [(p.where, p.message, p.code) for p in problems]) if problems else ("ok", plan.fingerprint)
    dist.all_gather_object(verdicts, own, group=group)
    bad = [
        Problem(f"rank {rank}: {where}", message, code=code)
        for rank, (status, found) in enumerate(verdicts)
        if status == "bad"
        for where, message, code in found
    ]
    if bad:
        raise UsageError(bad)
    fingerprints = [fingerprint for _, fingerprint in verdicts]
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
        problems.append(Problem(f"rank {rank}", text, code="plan-mismatch.ranks-differ"))
    raise PlanMismatchError(problems)


def dp_max_batch_size(batch_size: int, group: Any = None) -> int:
    """The largest decode batch size of any rank of ``group`` (one all-reduce of two integers): what every DP-attention
    rank pads its batch to with :func:`attngate.backends.runtime.dp_padding.pad_decode_batch`, so that all ranks run the
    same number of tokens and replay the same CUDA graph. An IDLE rank passes 0. Works over gloo and NCCL (NCCL
    reduces on the current CUDA device). A ``batch_size`` that is no integer >= 0, or a ``group`` that is no
    ProcessGroup (the reduce then runs on the default group), fails every rank with one UsageError naming the highest
    bad rank. Raises RuntimeError when torch.distributed is not initialized."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("dp_max_batch_size needs torch.distributed.init_process_group() first")
    group = _group_of(dist, group, "dp_max_batch_size")
    problems = count_problems(("batch_size", batch_size, 0))
    if group is not None and not isinstance(group, dist.ProcessGroup):
        problems.append(_bad_group(group))
        group = None
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    )
    rank = dist.get_rank(group)
    size = torch.tensor([0 if problems else batch_size, rank + 1 if problems else 0], dtype=torch.int64, device=device)
    dist.all_reduce(size, op=dist.ReduceOp.MAX, group=group)
    if problems:
        raise UsageError([dataclasses.replace(p, where=f"rank {rank}: {p.where}") for p in problems])
    if int(size[1].item()):
        raise UsageError(
            Problem(
                f"rank {int(size[1].item()) - 1}",
                "was given a bad argument of dp_max_batch_size (its error names it)",
                code="usage.rank-argument",
            )
        )
    return int(size[0].item())


def _group_of(dist: Any, group: Any, caller: str) -> Any:
    """``group`` as given; UsageError, before any collective, on a rank outside it (new_group's NON_GROUP_MEMBER):
    the group's members do not wait for such a rank."""
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise UsageError(
            Problem("group", f"this rank is not a member of the group given to {caller}", code="usage.process-group")
        )
    return group


def _bad_group(group: Any) -> Problem:
    return Problem(
        "group",
        f"takes a torch.distributed ProcessGroup or None (the default group), not {type(group).__name__} {group!r:.80}",
        code="usage.process-group",
    )
