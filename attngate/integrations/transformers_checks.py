"""The checks of :class:`attngate.integrations.transformers.AttngateRuntime`'s arguments, each listing every
problem in one UsageError before anything is allocated."""

from __future__ import annotations

import torch

from attngate.errors import Problem, UsageError
from attngate.facts.server_args import ServerArgs
from attngate.plan.schema import Plan

#: the attn_implementation name attngate registers with transformers
ATTN_IMPLEMENTATION = "attngate"


def check_runtime_arguments(
    model: torch.nn.Module,
    server_args: ServerArgs | None,
    page_size: int | None,
    num_slots: int,
    max_requests: int,
    max_context_len: int,
) -> int:
    """The page_size asked for (the argument, else server_args'; None for the plan's); UsageError naming every
    argument of AttngateRuntime that cannot work."""
    problems = []
    built_with = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if built_with != ATTN_IMPLEMENTATION:
        problems.append(
            Problem(
                "model",
                f"{type(model).__name__} was built with attn_implementation={built_with!r}; AttngateRuntime "
                f"needs attn_implementation={ATTN_IMPLEMENTATION!r}, or its attention bypasses attngate's cache",
            )
        )
    if server_args is not None and not isinstance(server_args, ServerArgs):
        problems.append(Problem("server_args", f"takes ServerArgs, not {type(server_args).__name__}"))
        server_args = None
    planned = server_args.page_size if server_args is not None else None
    if page_size is not None and planned is not None and page_size != planned:
        problems.append(
            Problem(
                "page_size",
                f"{page_size} differs from server_args.page_size {planned}; the pool must page as the plan does",
            )
        )
    for name, value in (
        ("page_size", page_size),
        ("num_slots", num_slots),
        ("max_requests", max_requests),
        ("max_context_len", max_context_len),
    ):
        if (name != "page_size" or value is not None) and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            problems.append(Problem(name, f"must be a positive integer, not {value!r}"))
    if problems:
        raise UsageError(problems)
    return page_size if page_size is not None else planned


def check_pool_fits_plan(plan: Plan, asked: int | None, num_slots: int) -> int:
    """The plan's page_size (rules may move it, as SGLang's FA4 on SM100 pages by 128); UsageError when the
    caller asked for another or num_slots is not a whole number of pages."""
    page_size = plan.common.page_size
    problems = []
    if asked is not None and asked != page_size:
        problems.append(
            Problem(
                "page_size",
                f"{asked} asked, but the plan pages by {page_size}; the pool must page as "
                f"the plan does (see the resolution's adjustments)",
            )
        )
    if num_slots % page_size:
        problems.append(Problem("num_slots", f"{num_slots} is not a multiple of the plan's page_size {page_size}"))
    if problems:
        raise UsageError(problems)
    return page_size
