"""A loaded rule set: its rules, predicates, invariants and deviations, each rule with its compiled condition."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attngate.errors import Problem, RulesError
from attngate.rules.condition import Condition

if TYPE_CHECKING:  # annotations only: the loaded rule set needs neither the entries' schemas nor their checkers
    from attngate.rules.deviations import Deviation
    from attngate.rules.invariants import Invariant
    from attngate.rules.spec import RuleKind
    from attngate.types import Scope


@dataclass(frozen=True, slots=True)
class FactValue:
    """An adjust value read from a fact when the rule fires (``adjust: {arg: {from: FACT}}``): how a rule sets an
    argument to a computed value (a derived fact such as ``speculative_chain_draft_tokens``) while conditions keep
    no arithmetic."""

    fact: str

    def of(self, facts: dict[str, Any]) -> Any:
        return facts[self.fact]

    def __repr__(self) -> str:
        return f"{{from: {self.fact}}}"


def adjust_value(value: Any, facts: dict[str, Any]) -> Any:
    """What an adjust value sets the argument to under ``facts``: the literal, or a FactValue's fact."""
    return value.of(facts) if isinstance(value, FactValue) else value


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """A loaded, type-checked rule, built by keyword (13 fields). ``where`` is its ``file:line:col``."""

    id: str
    kind: RuleKind
    summary: str
    why: str
    source: str
    where: str
    condition: Condition
    scope: Scope
    sets: dict[str, Any]  # gate -> value (kind set)
    adjusts: dict[str, Any]  # server arg -> value or FactValue (kind adjust; known_failure fallback)
    message: str | None
    issue: str | None
    backends: tuple[str, ...]

    def matches(self, facts: dict[str, Any]) -> bool:
        try:
            return self.condition(facts)
        except TypeError as exc:  # an order comparison met None: the condition lacks a guard
            raise RulesError(
                Problem(
                    self.where,
                    f"rule {self.id!r}: {exc}; guard the fact with 'is not None'",
                    code="rules.unguarded-none",
                )
            ) from None


@dataclass(frozen=True, slots=True)
class Predicate:
    """A named condition (``predicates:`` in the file), evaluated before rules and read like a bool fact."""

    name: str
    condition: Condition
    where: str


@dataclass(frozen=True, eq=False)  # identity hash: a loaded rule set is cached by identity
class RuleSet:
    rules: tuple[Rule, ...]
    filename: str
    predicates: tuple[Predicate, ...] = ()
    invariants: tuple[Invariant, ...] = ()
    deviations: tuple["Deviation", ...] = ()  # differences from SGLang on purpose (attngate conform)

    def with_predicates(self, facts: dict[str, Any]) -> dict[str, Any]:
        """``facts`` plus the value of every predicate (each may read the ones before it)."""
        if not self.predicates:
            return facts
        facts = dict(facts)
        for p in self.predicates:
            facts[p.name] = p.condition(facts)
        return facts

    def of_kind(self, *kinds: RuleKind) -> list[Rule]:
        return [r for r in self.rules if r.kind in kinds]

    def by_id(self, rule_id: str) -> Rule:
        for rule in self.rules:
            if rule.id == rule_id:
                return rule
        raise KeyError(rule_id)
