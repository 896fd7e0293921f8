"""``deviations:`` in a rules file: where attngate differs from SGLang 0.5.23 on purpose.

Each deviation states one cause: the server arguments whose values differ through it, ``refusal`` (attngate
refuses through the rules it lists, where SGLang accepts) and ``sglang_refusal`` (SGLang refuses, attngate
accepts); the configurations it covers (``when``, read on the arguments as the user gave them, before any
adjust rule, with the model and platform facts and the file's predicates), the reason and the source.
``attngate conform`` counts a difference as declared only where a deviation of that field matches; an attngate
refusal is declared where the matching deviations name, together, every rule it refused through. ``explain``
shows the deviations that apply; ``lint`` checks that each can hold and that no two overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attngate.errors import Problem
from attngate.facts.catalogue import FACTS, base_facts
from attngate.facts.model import ModelFacts
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.rules.condition import Condition, compile_condition
from attngate.rules.entries import validated_entries
from attngate.rules.spec import DeviationSpec
from attngate.rules.typecheck import ConditionErrors
from attngate.types import FactType
from attngate.util.suggest import did_you_mean
from attngate.util.yaml_source import YamlDocument

REFUSAL = "refusal"  # attngate refuses what SGLang accepts
SGLANG_REFUSAL = "sglang_refusal"  # SGLang refuses what attngate accepts
DEVIATION_FIELDS: tuple[str, ...] = (REFUSAL, SGLANG_REFUSAL, *ServerArgs.model_fields)


@dataclass(frozen=True, slots=True)
class Deviation:
    """A loaded deviation; ``where`` is its ``file:line:col``."""

    id: str
    fields: tuple[str, ...]
    reason: str
    source: str
    where: str
    condition: Condition
    rules: tuple[str, ...] = ()


def check_deviations(
    raw: Any, doc: YamlDocument, problems: list[Problem], predicate_types: dict[str, FactType]
) -> list[Deviation]:
    """Type-check the ``deviations:`` list; every problem goes to ``problems`` with file:line:col."""
    readable = {**{name: spec.type for name, spec in FACTS.items()}, **predicate_types}
    out: list[Deviation] = []
    for path, spec in validated_entries(raw, doc, problems, DeviationSpec, "deviations", "deviation"):
        fields = (spec.fields,) if isinstance(spec.fields, str) else tuple(spec.fields)
        unknown = [f for f in fields if f not in DEVIATION_FIELDS]
        for name in unknown:
            problems.append(
                Problem(
                    doc.where(path + ("fields",)),
                    f"deviation {spec.id!r}: {name!r} is neither a server "
                    "argument nor refusal / sglang_refusal" + did_you_mean(name, DEVIATION_FIELDS),
                )
            )
        if bool(spec.rules) != (REFUSAL in fields):
            problems.append(
                Problem(
                    doc.where(path + ("rules",) if spec.rules else path + ("fields",)),
                    f"deviation {spec.id!r}: fields: refusal (attngate refuses) goes with rules: the "
                    "refusing rules it declares, and rules: with fields: refusal",
                )
            )
        if unknown or not fields:
            continue
        text = spec.when if isinstance(spec.when, str) else str(spec.when)
        try:
            condition = compile_condition(text, readable)
        except ConditionErrors as exc:
            for err in exc.errors:
                problems.append(Problem(doc.where(path + ("when",), err.col), f"deviation {spec.id!r}: {err.message}"))
            continue
        out.append(
            Deviation(
                spec.id, fields, spec.reason, spec.source, doc.where(path + ("id",)), condition, tuple(spec.rules)
            )
        )
    return out


def given_facts(rules: Any, args: ServerArgs, model: ModelFacts, platform: Platform) -> dict[str, Any]:
    """The facts a deviation's ``when`` reads: the arguments as given, the model, the platform, the predicates."""
    return rules.with_predicates(base_facts(args, model, platform))


def refusing_rules(violations: list[Any]) -> frozenset[str]:
    """The rules a refusal is declared by: its violations' rules, less adjust conflicts where a forbid rule also
    matched (the conflict follows from what the forbid rule refuses). A violation no rule makes (the engine's, an
    argument's) counts under its label, which no deviation names: such a refusal is never declared."""
    causes = [v for v in violations if v.kind != "conflict"] or violations
    return frozenset(r for v in causes for r in (v.rules or (v.where,)))


def applicable_deviations(
    rules: Any, facts: dict[str, Any], refused_by: frozenset[str] = frozenset()
) -> list[Deviation]:
    """The deviations of ``rules`` that hold under ``facts`` (:func:`given_facts`) and declare something of this
    outcome. ``refused_by``: the rules through which attngate refused the configuration (empty: it accepted). A
    refusal is declared by the matching deviations that name its rules, and only where they name every one of
    ``refused_by`` between them; an accepted configuration by those with value fields or ``sglang_refusal``."""
    held = [d for d in rules.deviations if d.condition(facts)]
    if not refused_by:
        return [d for d in held if set(d.fields) - {REFUSAL}]
    naming = [d for d in held if refused_by & set(d.rules)]
    return naming if refused_by <= {rule for d in naming for rule in d.rules} else []


def matching_deviations(
    rules: Any, args: ServerArgs, model: ModelFacts, platform: Platform, refused_by: frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    """``{field: [deviation ids]}`` of :func:`applicable_deviations` for this configuration: for a refusal by
    attngate only ``refusal``, else every field but ``refusal``."""
    if not rules.deviations:
        return {}
    out: dict[str, list[str]] = {}
    for deviation in applicable_deviations(rules, given_facts(rules, args, model, platform), refused_by):
        for name in deviation.fields:
            if (name == REFUSAL) == bool(refused_by):
                out.setdefault(name, []).append(deviation.id)
    return out
