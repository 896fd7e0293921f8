"""The start-up check an SGLang launcher makes: does attngate's Plan decide what SGLang just decided?

::

    from sglang.srt.server_args import ServerArgs
    from attngate.integrations.sglang import verify

    server_args = ServerArgs(model_path=path, attention_backend="fa3")
    server_args.resolve_once()                        # SGLang's own resolution
    resolution = verify(server_args)                  # the Plan, or SglangMismatchError

Every difference that no ``deviations:`` entry of the rules declares is one problem of the error: the
field, SGLang's value, the Plan's value and the rule that set it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from attngate.engine.result import Resolution
from attngate.errors import AttngateError, Problem, UsageError
from attngate.facts.model import ModelFacts
from attngate.facts.platform import Platform
from attngate.integrations.sglang.cases import SGLANG_KERNELS
from attngate.integrations.sglang.compare import CaseResult, compare_case
from attngate.rules.load import load_rules
from attngate.rules.ruleset import RuleSet

logger = logging.getLogger("attngate.sglang")


class SglangMismatchError(AttngateError):
    title = "attngate's plan and SGLang's resolution disagree"


def verify(
    server_args: Any,
    *,
    model_config: str | Path | None = None,
    gpu: str | None = None,
    kernels: tuple[str, ...] = SGLANG_KERNELS,
    rules: RuleSet | None = None,
    strict: bool = True,
) -> Resolution | None:
    """Resolve the Plan from the arguments SGLang was given and compare it with SGLang's resolution of them.

    Args:
        server_args: ``sglang.srt.server_args.ServerArgs`` after ``resolve_once()``.
        model_config: config.json or its folder (default: ``server_args.model_path``).
        gpu: ``sm90``... (default: this host's GPU, ``Platform.detect()``).
        kernels: the kernel providers or a preset (default: a stock SGLang install on ``gpu``; without ``gpu``,
            what this host has).
        rules: a loaded RuleSet (default: the shipped rules.yaml).
        strict: raise on an undeclared difference; False logs each one (warning) and goes on.

    Returns the Resolution (None where attngate refused and ``strict`` is False). Raises SglangMismatchError
    listing every undeclared difference, UsageError for an unresolved ``server_args``, and attngate's input
    errors (model config, GPU).
    """
    given = getattr(server_args, "_raw_input", None)
    if not getattr(server_args, "_resolution_finished", False) or given is None:
        raise UsageError(
            Problem(
                "server_args",
                "takes SGLang's ServerArgs after resolve_once() (its resolution records the arguments as given)",
            )
        )
    rules = rules or load_rules()
    model = ModelFacts.from_hf_config(Path(model_config or server_args.model_path))
    platform = Platform.from_name(gpu, kernels=kernels) if gpu else Platform.detect()
    result = compare_case("sglang", dict(given), server_args.resolved_dict(), None, model, platform, rules, keep=True)
    problems = _problems(result)
    if problems and strict:
        raise SglangMismatchError(problems)
    for problem in problems:
        logger.warning("attngate/SGLang mismatch: %s", problem)
    return result.resolution


def _problems(result: CaseResult) -> list[Problem]:
    problems = []
    for name, (sglang, mine) in result.differences.items():
        if result.declared.get(name):
            continue
        if name == "refusal":
            problems.append(Problem("refusal", f"SGLang accepted the configuration; attngate refuses it: {mine}"))
            continue
        origin = result.origins.get(name, "as given")
        why = [a.message for a in result.resolution.adjustments if a.rule == origin] if result.resolution else []
        problems.append(
            Problem(
                name,
                f"SGLang resolved {sglang!r}; the Plan has {mine!r} ({origin}" + (f": {why[0]}" if why else "") + ")",
            )
        )
    return problems
