"""Rule coverage over a set of resolve() calls: which rules fired, which never did, and for each atom
of each condition (a comparison, a fact or a predicate, the leaves under and/or/not) whether it was
seen true and seen false. Also which of the file's deviations applied to no configuration. Fed by
:data:`attngate.engine.index.OBSERVERS` and ``DEVIATION_OBSERVERS``; the pytest plugin
(attngate.testing.pytest_plugin, ``--rule-coverage``) reports it for a test session.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from attngate.rules.condition import _compile
from attngate.rules.ruleset import Rule, RuleSet

_NO_BUILTINS = {"__builtins__": {}}


@dataclass
class _Atom:
    text: str
    code: Any
    seen: set[bool] = field(default_factory=set)


@dataclass
class _RuleRecord:
    rule: Rule
    atoms: list[_Atom]
    fired: int = 0
    evaluated: int = 0
    fired_in: set[str] = field(default_factory=set)  # the tests (pytest node ids) in which it fired


def _atoms(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BoolOp):
        return [a for v in node.values for a in _atoms(v)]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _atoms(node.operand)
    return [node]


class RuleCoverage:
    """Coverage of the rule file at ``filename`` (other rule sets passing through resolve() are ignored)."""

    def __init__(self, filename: str):
        self.filename = filename
        self.records: dict[str, _RuleRecord] = {}
        self.deviations_applied: set[str] = set()
        self.current_test: str | None = None  # set by the pytest plugin around each test

    def observe_deviations(self, rules: RuleSet, applied: list[Any]) -> None:
        """Record the deviations that applied to one resolved (or refused) configuration."""
        if rules.filename == self.filename:
            self.deviations_applied.update(d.id for d in applied)

    def observe(self, rules: RuleSet, scope: str, facts: dict[str, Any]) -> None:
        if rules.filename != self.filename:
            return
        for rule in rules.rules:
            if _scope(rule) != scope:
                continue
            record = self.records.get(rule.id) or self._record(rule)
            try:
                fired = rule.condition(facts)
            except Exception:  # noqa: BLE001 - coverage never changes what a test sees
                continue
            record.evaluated += 1
            record.fired += bool(fired)
            if fired and self.current_test is not None:
                record.fired_in.add(self.current_test)
            for atom in record.atoms:
                try:
                    atom.seen.add(bool(eval(atom.code, _NO_BUILTINS, facts)))  # noqa: S307 - the rule's own whitelisted AST
                except Exception:  # noqa: BLE001, S110 - e.g. an order comparison its guard would have skipped
                    pass

    def _record(self, rule: Rule) -> _RuleRecord:
        source = rule.condition.text
        atoms = [
            _Atom(ast.get_source_segment(source, a) or ast.unparse(a), _compile(ast.Expression(body=a), "<atom>"))
            for a in _atoms(rule.condition.tree.body)
        ]
        self.records[rule.id] = record = _RuleRecord(rule, atoms)
        return record

    def report(self, rules: RuleSet) -> dict[str, Any]:
        """Totals, the percentage (rules fired + atom outcomes seen, over rules + 2 x atoms) and what is missing."""
        for rule in rules.rules:  # rules never evaluated count as not fired, atoms as never seen
            if rule.id not in self.records:
                self._record(rule)
        records = [self.records[r.id] for r in rules.rules]
        fired = [r for r in records if r.fired]
        atoms = [a for r in records for a in r.atoms]
        outcomes = sum(len(a.seen) for a in atoms)
        total = len(records) + 2 * len(atoms)
        return {
            "file": self.filename,
            "percent": round(100 * (len(fired) + outcomes) / total, 2) if total else 100.0,
            "rules": len(records),
            "rules_fired": len(fired),
            "atoms": len(atoms),
            "atom_outcomes_seen": outcomes,
            "never_fired": [{"rule": r.rule.id, "where": r.rule.where} for r in records if not r.fired],
            "deviations": len(rules.deviations),
            "deviations_never_applied": [
                {"deviation": d.id, "where": d.where} for d in rules.deviations if d.id not in self.deviations_applied
            ],
            "fired_in": {r.rule.id: sorted(r.fired_in) for r in records if r.fired_in},
            "atoms_not_seen_both_ways": [
                {"rule": r.rule.id, "atom": a.text, "seen": sorted(a.seen)}
                for r in records
                for a in r.atoms
                if len(a.seen) < 2
            ],
        }


def _scope(rule: Rule) -> str:
    if rule.adjusts:
        return "adjust"
    return rule.scope if rule.kind == "set" else "global"
