"""Stages 1 and 2 of resolve(): adjust rules to a fixed point, then the checks (forbid, known_failure).

Every adjust round evaluates all adjust rules (and known_failure rules with a ``fallback``) on the same state and
applies their changes together, so the order of rules in the file cannot change the result. Two rules asking one
argument for different values is a conflict; a state that repeats is an oscillation; both name the rules involved.
"""

from __future__ import annotations

from typing import Any

from attngate.engine.index import RuleIndex, observe, read_by
from attngate.engine.result import Adjustment, Violation
from attngate.errors import PlanError
from attngate.facts.catalogue import FACTS
from attngate.rules.ruleset import FactValue, Rule, adjust_value
from attngate.types import ViolationKind

MAX_ADJUST_ROUNDS = 32


def adjust(state: dict[str, Any], fixed: dict[str, Any], index: RuleIndex) -> tuple[dict[str, Any], list[Adjustment]]:
    rounds: list[list[Adjustment]] = []
    seen = {_freeze(state): 0}  # state -> number of rounds after which it held
    while len(rounds) < MAX_ADJUST_ROUNDS:
        facts = index.facts(fixed, state)
        observe(index.rules, "adjust", facts)
        wanted: dict[str, dict[Any, list[Rule]]] = {}
        for rule in index.adjust:
            if rule.matches(facts):
                for name, value in rule.adjusts.items():
                    wanted.setdefault(name, {}).setdefault(adjust_value(value, facts), []).append(rule)
        done = [a for r in rounds for a in r]
        conflicts = [
            Violation.of_rules(
                (r.id for rs in by_value.values() for r in rs),
                f"adjust rules disagree on {name}: "
                + ", ".join(f"{rs[0].id} wants {v!r}" for v, rs in by_value.items()),
                ViolationKind.CONFLICT,
            )
            for name, by_value in wanted.items()
            if len(by_value) > 1
        ]
        if conflicts:  # forbid rules that already match usually say why, so report them too
            observe(index.rules, "global", facts)  # (and rule coverage sees them evaluated)
            raise PlanError([*rule_violations(facts, index), *conflicts], state, done)
        round_ = [
            Adjustment(rules[0].id, name, state[name], value, rules[0].message or "", rules[0].issue)
            for name, by_value in wanted.items()
            for value, rules in by_value.items()
            if state[name] != value
        ]
        out_of_type = [
            _out_of_type(rules[0], name, value)
            for name, by_value in wanted.items()
            for value, rules in by_value.items()
            if not FACTS[name].type.accepts(value)
        ]
        if out_of_type:  # a value read from a fact ({from: FACT}) can leave the argument's bounds
            raise PlanError(out_of_type, state, done)
        if not round_:
            return state, done
        state = {**state, **{a.field: a.new for a in round_}}
        rounds.append(round_)
        key = _freeze(state)
        if key in seen:
            cycle = [a for r in rounds[seen[key] :] for a in r]
            raise PlanError(
                [
                    Violation.of_rules(
                        sorted({a.rule for a in cycle}),
                        "adjust rules never settle; they rewrite in a cycle: " + "; ".join(map(str, cycle)),
                        ViolationKind.OSCILLATION,
                    )
                ],
                state,
                done + round_,
            )
        seen[key] = len(rounds)
    raise PlanError(
        [
            Violation.of_rules(
                sorted({a.rule for r in rounds for a in r}),
                f"adjust rules did not settle within {MAX_ADJUST_ROUNDS} rounds",
                ViolationKind.OSCILLATION,
            )
        ],
        state,
        [a for r in rounds for a in r],
    )


def _out_of_type(rule: Rule, name: str, value: Any) -> Violation:
    source = rule.adjusts[name]
    origin = f" (from {source.fact})" if isinstance(source, FactValue) else ""
    return Violation.of_rule(
        rule.id,
        f"sets {name} to {value!r}{origin}, but {name} is {FACTS[name].type.describe()}",
        ViolationKind.OUT_OF_TYPE,
        issue=rule.issue,
    )


def _freeze(state: dict[str, Any]) -> tuple:
    return tuple(sorted(state.items()))


def rule_violations(facts: dict[str, Any], index: RuleIndex) -> list[Violation]:
    return [
        Violation.of_rule(r.id, r.message or r.summary, ViolationKind(r.kind), facts=read_by(r, facts), issue=r.issue)
        for r in index.checks
        if r.matches(facts)
    ]


def violations(facts: dict[str, Any], index: RuleIndex) -> list[Violation]:
    out = rule_violations(facts, index)
    for side in ("prefill_backend", "decode_backend"):
        if facts[side] is None:
            out.append(
                Violation.of_engine(
                    f"no rule chose a {side.replace('_', ' ')}",
                    ViolationKind.UNRESOLVED,
                    help="pass --attention-backend",
                )
            )
    return out
