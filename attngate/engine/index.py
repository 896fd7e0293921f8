"""The rule set indexed by what each rule does, the evaluation context of one configuration, and the hooks
that watch every evaluation (rule coverage listens to them)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from attngate.facts.derived import derived_facts
from attngate.plan.registry import GATES
from attngate.rules.condition import gate_key
from attngate.rules.ruleset import Rule, RuleSet

#: Called as ``observer(rules, scope, facts)`` with every evaluation context of every resolve() (scope
#: "adjust" per adjustment round, "global", then "mode" per forward mode and "layer" per layer kind);
#: rule coverage listens here.
OBSERVERS: list[Callable[[RuleSet, str, dict[str, Any]], None]] = []
#: Called with the rule set and the deviations that apply to each configuration resolved (rule coverage).
DEVIATION_OBSERVERS: list[Callable[[RuleSet, list[Any]], None]] = []

GLOBAL_SPECS = [g for g in GATES.values() if g.scope == "global"]
MODE_SPECS = [g for g in GATES.values() if g.scope == "mode"]
LAYER_SPECS = [g for g in GATES.values() if g.scope == "layer"]


def observe(rules: RuleSet, scope: str, facts: dict[str, Any]) -> None:
    for observer in OBSERVERS:
        observer(rules, scope, facts)


class RuleIndex:
    """The rules by kind: adjusting, checking (forbid, known_failure without fallback), and setting gates per scope."""

    def __init__(self, rules: RuleSet):
        self.rules = rules
        self.adjust = [r for r in rules.rules if r.adjusts]
        self.checks = [r for r in rules.rules if r.kind == "forbid" or (r.kind == "known_failure" and not r.adjusts)]
        sets = [r for r in rules.rules if r.kind == "set"]
        self.global_set = [r for r in sets if r.scope == "global"]
        self.mode_set = [r for r in sets if r.scope == "mode"]
        self.layer_set = [r for r in sets if r.scope == "layer"]

    def facts(self, fixed: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        """Model/platform facts + server args + derived facts + the rule file's predicates."""
        return self.rules.with_predicates({**fixed, **args, **derived_facts({**fixed, **args})})


@functools.lru_cache(maxsize=8)
def index_of(rules: RuleSet) -> RuleIndex:
    return RuleIndex(rules)


def read_by(rule: Rule, facts: dict[str, Any]) -> dict[str, Any]:
    """The facts (and resolved gates) ``rule``'s condition reads, with their values."""
    return {name: facts.get(gate_key(name) if "." in name else name) for name in rule.condition.reads}
