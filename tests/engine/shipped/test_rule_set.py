"""The shipped rule set as a whole: lint-clean and documented, and every rule's truth table (the compiled condition
against an independent z3 encoding)."""

from __future__ import annotations

import ast
import itertools
import math
import random

import z3

from attngate import Platform, ServerArgs
from attngate.analysis.encoding import Encoder
from attngate.analysis.lint import lint_rules
from attngate.facts.catalogue import FACTS, base_facts
from attngate.plan.registry import GATES
from attngate.rules.condition import gate_key
from tests.support.helpers import model


def test_shipped_rules_lint_clean_and_documented(rules):
    assert lint_rules(rules) == []
    assert len(rules.rules) >= 35
    for r in rules.rules:
        assert r.summary and r.why and r.source, r.id


def _domain(name: str, literals: set) -> list:
    t = (
        (GATES[name].type if name in GATES else FACTS[name].type)
        if name not in ("forward_mode", "layer_kind")
        else None
    )
    if t is None:
        from attngate.facts.catalogue import LAYER_FACT, MODE_FACT

        t = MODE_FACT.type if name == "forward_mode" else LAYER_FACT.type
    values: list = []
    if t.base == "bool":
        values = [False, True]
    elif t.choices and len(t.choices) <= 6:
        values = list(t.choices)
    elif t.choices:
        values = [v for v in t.choices if v in literals] + [next(v for v in t.choices if v not in literals)]
    elif t.base == "int":
        values = sorted({x + d for x in literals if isinstance(x, int) for d in (-1, 0, 1)} | {0})
    elif t.base == "float":
        values = sorted(
            {float(x) + d for x in literals if isinstance(x, (int, float)) for d in (-0.5, 0.0, 0.5)} | {0.0}
        )
    else:
        values = [v for v in literals if isinstance(v, str)] + ["<other>"]
    return values + ([None] if t.optional else [])


def _reads(node: ast.AST, predicates: dict) -> tuple[set[str], set]:
    names, literals = set(), set()
    groups = {id(a.value) for a in ast.walk(node) if isinstance(a, ast.Attribute)}
    for sub in ast.walk(node):
        if id(sub) in groups:
            continue
        if isinstance(sub, ast.Name) and sub.id in predicates:
            read_names, read_literals = _reads(predicates[sub.id], predicates)
            names |= read_names
            literals |= read_literals
        elif isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(f"{sub.value.id}.{sub.attr}")
        elif isinstance(sub, ast.Constant) and not isinstance(sub.value, bool):
            literals.add(sub.value)
        elif isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.USub) and isinstance(sub.operand, ast.Constant):
            literals.add(-sub.operand.value)
    return names, literals


def test_every_rule_truth_table_matches_an_independent_encoding(rules):
    """The compiled Python condition and the z3 encoding agree on every (sampled) assignment."""
    enc = Encoder(rules)
    predicates = {p.name: p.condition.tree.body for p in rules.predicates}
    base = rules.with_predicates(
        base_facts(ServerArgs(attention_backend="fa3"), model("Llama-3.1-8B"), Platform.from_name("sm90"))
    )
    rng = random.Random(0)
    checked = 0
    for rule in rules.rules:
        names, literals = _reads(rule.condition.tree.body, predicates)
        domains = {n: _domain(n, literals) for n in sorted(names)}
        if math.prod(len(d) for d in domains.values()) <= 4096:
            combos = list(itertools.product(*domains.values()))
            rng.shuffle(combos)
        else:  # too many to list: sample each fact independently
            combos = [tuple(rng.choice(d) for d in domains.values()) for _ in range(48)]
        formula = enc.encode(rule.condition.tree.body)
        seen = {True: 0, False: 0}
        for combo in combos[:48]:
            assignment = dict(zip(domains, combo))
            facts = dict(base)
            for n, v in assignment.items():
                facts[gate_key(n) if "." in n else n] = v
            facts = rules.with_predicates(facts)
            try:
                py = rule.matches(facts)
            except Exception:
                continue
            solver = z3.Solver()
            for n, v in assignment.items():
                value, none = enc.var(n)
                solver.add(none if v is None else z3.And(z3.Not(none), value == _z3(v)))
            assert solver.check(formula if py else z3.Not(formula)) == z3.sat, (rule.id, assignment)
            seen[py] += 1
            checked += 1
        assert seen[True] or seen[False], rule.id
    assert checked > 1000


def _z3(v):
    if isinstance(v, bool):
        return z3.BoolVal(v)
    if isinstance(v, int):
        return z3.IntVal(v)
    if isinstance(v, float):
        return z3.RealVal(v)
    return z3.StringVal(v)
