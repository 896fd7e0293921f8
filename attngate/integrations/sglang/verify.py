"""The start-up check an SGLang launcher makes: does attngate's Plan decide what SGLang just decided?

::

    from sglang.srt.server_args import ServerArgs
    from attngate.integrations.sglang import verify

    server_args = ServerArgs(model_path=path, attention_backend="fa3")
    server_args.resolve_once()                        # SGLang's own resolution
    resolution = verify(server_args)                  # the Plan, or SglangMismatchError

Every difference that no ``deviations:`` entry of the rules declares is one problem of the error: the
field, SGLang's value, the Plan's value and the rule that set it. Each declared one is logged (info) with the
deviation that excused it; :func:`compare_with_sglang` returns both kinds.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attngate.engine.result import Resolution
from attngate.errors import Problem, SglangMismatchError, UsageError, argument_problems
from attngate.facts.model import ModelFacts
from attngate.facts.platform import Platform
from attngate.integrations.sglang.cases import SGLANG_KERNELS
from attngate.integrations.sglang.compare import CaseResult, compare_case
from attngate.rules.load import load_rules
from attngate.rules.ruleset import RuleSet

logger = logging.getLogger("attngate.sglang")

_SERVER_ARGS = "sglang.srt.server_args.ServerArgs"


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
        rules: a loaded RuleSet (default: the shipped rules.yaml; a file: ``load_rules(path)``).
        strict: raise on an undeclared difference; False logs each one (warning) and goes on.

    Each difference a deviation declares is logged (info, logger ``attngate.sglang``) with the deviation that
    excused it; :func:`compare_with_sglang` returns them. Returns the Resolution (None where attngate refused and
    ``strict`` is False). Raises SglangMismatchError listing every undeclared difference, UsageError naming every
    argument of the wrong kind (an unresolved or no ``server_args``, a ``model_path`` that is no path, rules given as
    a path), and attngate's input errors (model config, GPU).
    """
    problems = argument_problems(("strict", strict, bool, ""))
    try:
        result = compare_with_sglang(server_args, model_config=model_config, gpu=gpu, kernels=kernels, rules=rules)
    except UsageError as err:
        raise UsageError([*err.problems, *problems]) from None
    if problems:
        raise UsageError(problems)
    problems = _problems(result)
    if problems and strict:
        raise SglangMismatchError(problems)
    for problem in problems:
        logger.warning("attngate/SGLang mismatch: %s", problem)
    return result.resolution


def compare_with_sglang(
    server_args: Any,
    *,
    model_config: str | Path | None = None,
    gpu: str | None = None,
    kernels: tuple[str, ...] = SGLANG_KERNELS,
    rules: RuleSet | None = None,
) -> CaseResult:
    """What :func:`verify` compares (same arguments), raising nothing for a difference: ``differences`` maps each
    differing field (or ``refusal``) to SGLang's and the Plan's values, ``declared`` each declared one to the
    deviations that excuse it (each logged at info level), ``resolution`` the Resolution (None: attngate refused).
    Raises UsageError naming every bad argument, and attngate's input errors (model config, GPU)."""
    _check_arguments(server_args, model_config, gpu, kernels, rules)
    rules = rules or load_rules()
    model = ModelFacts.from_hf_config(Path(model_config or server_args.model_path))
    platform = Platform.from_name(gpu, kernels=kernels) if gpu else Platform.detect()
    given = dict(server_args._raw_input)
    result = compare_case("sglang", given, server_args.resolved_dict(), None, model, platform, rules, keep=True)
    where = {d.id: d.where for d in rules.deviations}
    for name, ids in result.declared.items():
        sglang, mine = result.differences[name]
        logger.info(
            "attngate/SGLang difference on %s (SGLang %r, the Plan %r) declared by deviation %s",
            name,
            sglang,
            mine,
            ", ".join(f"{i} ({where.get(i, '?')})" for i in ids),
        )
    return result


def _check_arguments(server_args: Any, model_config: Any, gpu: Any, kernels: Any, rules: Any) -> None:
    """UsageError naming every argument :func:`compare_with_sglang` cannot use, before anything is read."""
    problems = argument_problems(
        ("model_config", model_config, (str, Path, type(None)), "config.json or its folder"),
        ("gpu", gpu, (str, type(None)), "e.g. 'sm90'"),
        ("kernels", kernels, (tuple, list), "provider names or a preset, e.g. ('sglang',)"),
        ("rules", rules, (RuleSet, type(None)), "load a rules file with attngate.load_rules(path)"),
    )
    if isinstance(kernels, (tuple, list)) and not all(isinstance(k, str) for k in kernels):
        problems.append(
            Problem("kernels", f"takes provider names (strings), not {list(kernels)!r}", code="usage.argument-type")
        )
    if isinstance(server_args, type) or not callable(getattr(server_args, "resolved_dict", None)):
        shown = f"the class {server_args.__name__}" if isinstance(server_args, type) else type(server_args).__name__
        problems.append(
            Problem(
                "server_args", f"takes an instance of SGLang's {_SERVER_ARGS}, not {shown}", code="usage.argument-type"
            )
        )
    elif not getattr(server_args, "_resolution_finished", False) or not isinstance(
        getattr(server_args, "_raw_input", None), Mapping
    ):
        problems.append(
            Problem(
                "server_args",
                "takes SGLang's ServerArgs after resolve_once() (its resolution records the arguments as given)",
                code="usage.sglang-server-args-unresolved",
            )
        )
    elif model_config is None and not isinstance(getattr(server_args, "model_path", None), (str, Path)):
        path = getattr(server_args, "model_path", None)
        problems.append(
            Problem(
                "server_args.model_path",
                f"is {type(path).__name__} {path!r}, not a path to the model's config.json or folder",
                code="usage.model-path",
                help="pass model_config=",
            )
        )
    if problems:
        raise UsageError(problems)


def _problems(result: CaseResult) -> list[Problem]:
    problems = []
    for name, (sglang, mine) in result.differences.items():
        if result.declared.get(name):
            continue
        if name == "refusal":
            problems.append(
                Problem(
                    "refusal",
                    f"SGLang accepted the configuration; attngate refuses it: {mine}",
                    code="sglang-mismatch.refusal",
                )
            )
            continue
        origin = result.origins.get(name, "as given")
        why = [a.message for a in result.resolution.adjustments if a.rule == origin] if result.resolution else []
        problems.append(
            Problem(
                name,
                f"SGLang resolved {sglang!r}; the Plan has {mine!r} ({origin}" + (f": {why[0]}" if why else "") + ")",
                code="sglang-mismatch.value",
            )
        )
    return problems
