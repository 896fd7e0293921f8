"""Stage 3 of resolve(): each gate takes the value its matching ``set`` rules give it (two different values: a
conflict), else its fact or its default; then the values grouped as the Plan holds them."""

from __future__ import annotations

from typing import Any

from attngate.engine.result import Violation
from attngate.plan.registry import GATES, GateSpec
from attngate.rules.ruleset import Rule
from attngate.types import ViolationKind


def resolve_scope(
    rules: list[Rule], facts: dict[str, Any], specs: list[GateSpec], violations: list[Violation]
) -> tuple[dict[str, Any], dict[str, list[Rule]]]:
    hits: dict[str, list[Rule]] = {}
    for rule in rules:
        if rule.matches(facts):
            for name in rule.sets:
                hits.setdefault(name, []).append(rule)
    values: dict[str, Any] = {}
    for spec in specs:
        matched = hits.get(spec.name)
        if not matched:
            values[spec.name] = facts[spec.from_fact] if spec.from_fact else spec.default
            if not spec.type.accepts(values[spec.name]):
                violations.append(
                    Violation.of_engine(
                        f"gate {spec.name} takes its value from {spec.from_fact}, which is "
                        f"{values[spec.name]!r}; no rule filled it ({spec.type.describe()} needed)",
                        ViolationKind.UNRESOLVED,
                    )
                )
            continue
        distinct = {repr(r.sets[spec.name]) for r in matched}
        if len(distinct) > 1:
            where = f" for forward_mode={facts['forward_mode']}" if "forward_mode" in facts else ""
            where += f" for layer_kind={facts['layer_kind']}" if "layer_kind" in facts else ""
            violations.append(
                Violation.of_rules(
                    (r.id for r in matched),
                    f"set rules disagree on {spec.name}{where}: "
                    + ", ".join(f"{r.id} sets {r.sets[spec.name]!r}" for r in matched),
                    ViolationKind.CONFLICT,
                )
            )
        values[spec.name] = matched[0].sets[spec.name]
    return values, hits


def grouped(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        spec = GATES[name]
        groups.setdefault(spec.group, {})[spec.field] = value
    return groups
