"""``invariants:`` in a rules file: assertions over facts and gates of every scope that ``attngate lint`` proves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attngate.errors import Problem
from attngate.facts.catalogue import FACTS, LAYER_FACT, MODE_FACT
from attngate.plan.registry import GATES
from attngate.rules.condition import Condition, compile_condition

if TYPE_CHECKING:
    from attngate.types import FactType
    from attngate.util.yaml_source import YamlDocument

_ALL_GATE_TYPES = {name: g.type for name, g in GATES.items()}
_INVARIANT_FACTS = {
    **{name: spec.type for name, spec in FACTS.items()},
    MODE_FACT.name: MODE_FACT.type,
    LAYER_FACT.name: LAYER_FACT.type,
}


@dataclass(frozen=True, slots=True)
class Invariant:
    """A loaded, type-checked invariant (``invariants:`` in the file); ``attngate lint`` proves it."""

    id: str
    summary: str
    source: str
    where: str
    condition: Condition


def check_invariants(
    raw: Any, doc: YamlDocument, problems: list[Problem], predicate_types: dict[str, FactType]
) -> list[Invariant]:
    """Invariants may read every fact, predicate and gate (any scope), forward_mode and layer_kind."""
    # imported here: a rule set read from the disk cache (attngate.rules.cache) is never checked again
    from attngate.rules.entries import validated_entries
    from attngate.rules.spec import InvariantSpec
    from attngate.rules.typecheck import ConditionErrors

    readable = {**_INVARIANT_FACTS, **predicate_types}
    out: list[Invariant] = []
    for path, spec in validated_entries(raw, doc, problems, InvariantSpec, "invariants", "invariant"):
        try:
            condition = compile_condition(spec.assert_, readable, _ALL_GATE_TYPES)
        except ConditionErrors as exc:
            problems += [
                err.problem(doc.where(path + ("assert",), err.col), f"invariant {spec.id!r}") for err in exc.errors
            ]
            continue
        out.append(Invariant(spec.id, spec.summary, spec.source, doc.where(path + ("assert",)), condition))
    return out
