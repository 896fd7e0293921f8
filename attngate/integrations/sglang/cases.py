"""Conformance cases: read from a JSON file, or generated as a covering array over the values the rules read.

A case is ``{"name", "model_config", "gpu", "args": {SGLang ServerArgs field: value}}`` with an optional
``"kernels"`` (attngate's kernel providers or a preset; default: ``["sglang"]``, a stock SGLang install on the
case's GPU, as ``attngate explain --gpu`` defaults to).
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attngate.errors import AttngateError, CaseFileError, Problem  # noqa: F401 - CaseFileError is importable here
from attngate.facts.catalogue import FACTS
from attngate.facts.choices import GPU_ARCHS, KERNEL_PROVIDERS
from attngate.facts.platform import KERNEL_PRESETS
from attngate.facts.server_args import ServerArgs
from attngate.integrations.sglang.fields import to_sglang_kwargs
from attngate.rules.ruleset import RuleSet
from attngate.util.inputs import parse_json, read_text

#: A stock SGLang install on the case's GPU (attngate.facts.platform.sglang_kernels): the same default as explain's.
SGLANG_KERNELS: tuple[str, ...] = ("sglang",)


@dataclass(frozen=True)
class Case:
    name: str
    model_config: Path
    gpu: str
    args: dict[str, Any] = field(default_factory=dict)
    kernels: tuple[str, ...] = SGLANG_KERNELS

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model_config": str(self.model_config),
            "gpu": self.gpu,
            "args": self.args,
            "kernels": list(self.kernels),
        }


def launch_line_kwargs(line: str) -> dict[str, Any]:
    """SGLang's ServerArgs keyword arguments for a launch line (``--tp 2 --attention-backend fa3``, a pasted
    ``python -m sglang.launch_server ...`` head dropped), as SGLang 0.5.23's own parser reads it: every value that
    differs from the parser's default. Raises ValueError with argparse's message for a line SGLang refuses."""
    import argparse
    import contextlib
    import io
    import shlex

    from sglang.srt.server_args import ServerArgs as SglangServerArgs

    from attngate.facts.launch import strip_command

    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    SglangServerArgs.add_cli_args(parser)
    argv = strip_command(shlex.split(line))
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            namespace = parser.parse_args(["--model-path", "{model}", *argv] if "--model-path" not in argv else argv)
    except (argparse.ArgumentError, SystemExit) as err:
        raise ValueError(str(err) if isinstance(err, argparse.ArgumentError) else messages.getvalue().strip()) from None
    values = vars(namespace)
    return {k: v for k, v in values.items() if k != "model_path" and v != parser.get_default(k)}


def load_cases(path: str | Path, sglang_fields: frozenset[str]) -> list[Case]:
    """Read a JSON list of cases. Raises CaseFileError with every problem, each naming the case's index."""
    path = Path(path)
    data = parse_json(read_text(path, CaseFileError, "cases file"), str(path), CaseFileError)
    if not isinstance(data, list):
        raise CaseFileError(
            Problem(
                str(path),
                "a cases file holds a JSON list of {name, model_config, gpu, args}",
                code="conform-cases.not-a-list",
            )
        )
    problems: list[Problem] = []
    cases = []
    for index, raw in enumerate(data):
        where = f"{path}: case {index}"
        if not isinstance(raw, dict):
            problems.append(
                Problem(
                    where, "a case is an object {name, model_config, gpu, args}", code="conform-cases.not-an-object"
                )
            )
            continue
        for key in sorted(set(raw) - {"name", "model_config", "gpu", "args", "kernels"}):
            problems.append(Problem(where, f"unknown key {key!r}", code="conform-cases.unknown-key"))
        name = raw.get("name", f"case-{index}")
        config = raw.get("model_config")
        if not isinstance(config, str):
            problems.append(
                Problem(
                    where,
                    "model_config: a path to a config.json (relative to the cases file) is required",
                    code="conform-cases.model-config-missing",
                )
            )
        elif not (path.parent / config).exists():
            problems.append(
                Problem(where, f"model_config: {config} does not exist", code="conform-cases.model-config-not-found")
            )
        gpu = raw.get("gpu")
        if gpu not in GPU_ARCHS:
            problems.append(
                Problem(where, f"gpu: {gpu!r} is not one of {', '.join(GPU_ARCHS)}", code="conform-cases.unknown-gpu")
            )
        args = raw.get("args", {})
        if isinstance(args, str):  # a launch line: read by SGLang's own parser
            try:
                args = launch_line_kwargs(args)
            except ValueError as err:
                problems.append(Problem(where, f"args: {err}", code="conform-cases.bad-args"))
                args = {}
        if not isinstance(args, dict):
            problems.append(
                Problem(
                    where,
                    "args: a mapping of SGLang ServerArgs fields to values, or a launch line",
                    code="conform-cases.bad-args",
                )
            )
            args = {}
        for key in args:
            if key not in sglang_fields:
                problems.append(
                    Problem(
                        where,
                        f"args: {key!r} is not a field of SGLang's ServerArgs",
                        code="conform-cases.unknown-field",
                    )
                )
        kernels = raw.get("kernels", list(SGLANG_KERNELS))
        if not isinstance(kernels, list) or any(k not in (*KERNEL_PROVIDERS, *KERNEL_PRESETS) for k in kernels):
            problems.append(
                Problem(
                    where,
                    f"kernels: a list of {', '.join((*KERNEL_PROVIDERS, *KERNEL_PRESETS))}",
                    code="conform-cases.bad-kernels",
                )
            )
            kernels = list(SGLANG_KERNELS)
        if isinstance(config, str):
            cases.append(Case(str(name), path.parent / config, str(gpu), dict(args), tuple(kernels)))
    if problems:
        raise CaseFileError(problems)
    return cases


def _literals(rules: RuleSet) -> dict[str, set[Any]]:
    """Every literal a rule condition compares a server argument with, by argument."""
    found: dict[str, set[Any]] = {}
    for condition in [r.condition for r in rules.rules] + [p.condition for p in rules.predicates]:
        for node in ast.walk(ast.parse(condition.text, mode="eval")):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = [s.id for s in sides if isinstance(s, ast.Name) and s.id in ServerArgs.model_fields]
            for side in sides:
                if isinstance(side, (ast.Constant, ast.Tuple)):
                    value = ast.literal_eval(side)
                    for name in names:
                        found.setdefault(name, set()).update(value if isinstance(value, tuple) else (value,))
    return found


def value_domains(rules: RuleSet) -> dict[str, list[Any]]:
    """For every server argument the rules read: its default, both values of a bool, and every value a rule
    compares it with (an ordered comparison's bound, and one past it)."""
    reads = {name for r in rules.rules for name in r.condition.reads} | {
        n for p in rules.predicates for n in p.condition.reads
    }
    literals = _literals(rules)
    domains: dict[str, list[Any]] = {}
    for name, info in ServerArgs.model_fields.items():
        if name not in reads:
            continue
        ftype = FACTS[name].type
        values: list[Any] = [info.default]
        if ftype.base == "bool":
            values += [not info.default]
        for value in sorted(literals.get(name, ()), key=repr):
            values += [value, value + 1] if ftype.base == "int" and isinstance(value, int) and value > 0 else [value]
        domains[name] = [v for v in dict.fromkeys(values) if ftype.accepts(v) and _expressible(name, v)]
    return {k: v for k, v in domains.items() if len(v) > 1}


#: SGLang arguments a setting needs beside it to be a configuration SGLang takes at all (attngate reads none of them).
COMPANIONS: dict[tuple[str, Any], dict[str, Any]] = {
    ("enable_prefill_cp", True): {"cp_strategy": "zigzag"},  # arg_groups/parallel_hook.py: CP needs a strategy
}
#: Speculative algorithms whose draft is a separate model (arg_groups/speculative_hook.py): the case drafts with the
#: target's own config.
_SEPARATE_DRAFT = ("DFLASH", "STANDALONE")


def _sglang_args(args: dict[str, Any]) -> dict[str, Any]:
    out = to_sglang_kwargs(args)
    for setting in args.items():
        out.update(COMPANIONS.get(setting, {}))
    if args.get("speculative_algorithm") in _SEPARATE_DRAFT:
        out.setdefault("speculative_draft_model_path", "{model}")
    return out


def _expressible(name: str, value: Any) -> bool:
    try:
        to_sglang_kwargs({name: value})
    except AttngateError:
        return False
    return True


def generate_cases(models: list[Path], gpus: list[str], rules: RuleSet, *, seed: int = 0) -> list[Case]:
    """Cases that meet, where a setting is one non-default value of one server argument the rules read
    (:func:`value_domains`): every model on every GPU with no setting; every setting on every GPU alone; and every
    two settings of different arguments together, each pair once, on the GPU and model that cover the most
    (GPU, setting), (model, setting) and (GPU, model) pairs not yet covered. The other arguments stay at SGLang's
    defaults. A greedy array of our own: allpairspy takes one column per parameter, and two columns over one
    list of settings meet each unordered pair in one orientation only, about half of them. Named
    ``model/gpu/index``."""
    settings = [
        (name, value)
        for name, values in value_domains(rules).items()
        for value in values
        if value != ServerArgs.model_fields[name].default
    ]
    rng = random.Random(seed)
    rows: list[tuple[Path, str, tuple[tuple[str, Any], ...]]] = [(m, g, ()) for g in gpus for m in models]
    rows += [(models[i % len(models)], g, (s,)) for g in gpus for i, s in enumerate(settings)]
    pairs = [(a, b) for i, a in enumerate(settings) for b in settings[i + 1 :] if a[0] != b[0]]
    rng.shuffle(pairs)
    seen = (
        {(r[0], r[1]) for r in rows} | {(r[0], s) for r in rows for s in r[2]} | {(r[1], s) for r in rows for s in r[2]}
    )
    combos = [(m, g) for g in gpus for m in models]
    for a, b in pairs:
        start = rng.randrange(len(combos))  # ties go to a different combination each time
        model, gpu = max(
            combos[start:] + combos[:start],
            key=lambda c: sum(k not in seen for k in ((c[0], c[1]), (c[0], a), (c[0], b), (c[1], a), (c[1], b))),
        )
        seen.update(((model, gpu), (model, a), (model, b), (gpu, a), (gpu, b)))
        rows.append((model, gpu, (a, b)))
    return [
        Case(f"{Path(model).stem}/{gpu}/{index}", Path(model), gpu, _sglang_args(dict(chosen)))
        for index, (model, gpu, chosen) in enumerate(rows)
    ]
