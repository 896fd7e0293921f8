"""Lint's conflict search: rules of one scope that can match together and give one name (a gate, or a server argument
for adjust rules) different values, every such pair, in a number of solver queries linear in the rules.

Two steps keep it linear. First, exclusivity read off the syntax: a condition that implies ``fact in S`` for a finite
set of literals (a conjunct ``page_size == 16`` or ``model_type in ("llama", "mistral")`` at any depth of a
conjunction, a disjunction of such, through predicates, ``backends:`` and negations) cannot hold together with one
implying a set disjoint from S, so value classes are split on such facts (:func:`clash_groups`) and classes that
cannot meet are never put to the solver together. Second, per group of classes one query (can two of them match together?); where it is sat, one
query per rule of the group's larger side against the disjunction of the rules it could conflict with, a pair
extracted only where that query is sat (and the query repeated without the partners found): a gate whose values
conflict with many rules costs a query or two per rule, never one per pair of rules. (Enumerating by blocking each
model's pairs, as lint did before, loses pairs: a pair that can only match beside a blocked one is blocked too.)

Every query is three-valued (attngate.analysis.verdict): one z3 cannot decide is reported as an
:class:`~attngate.analysis.verdict.Unknown` naming its rules, never read as "no conflict".
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from itertools import combinations
from typing import Any

import z3

from attngate.analysis.verdict import Unknown, Verdict, check
from attngate.rules.ruleset import Rule, RuleSet
from attngate.types import FactType


def literal_key(value: Any) -> tuple:
    """A literal as the encoding compares it: numbers by value (``16 == 16.0``), bools, strings and None apart."""
    if value is None:
        return ("none",)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", value)
    return ("str", value)


def implied_values(
    node: ast.expr, predicates: dict[str, ast.expr], types: dict[str, FactType]
) -> dict[str, frozenset[tuple]]:
    """``{fact: literal_keys}`` for every fact that ``node`` (a condition's syntax tree) confines to a finite set of
    literals whenever it holds: ``fact == literal``, ``fact in (literals)``, ``fact is None``, a bool fact read bare
    (True) or negated (False, where the fact cannot be None); a conjunction confines a fact to the intersection of
    what its parts allow (empty: the condition never holds), a disjunction to the union where every part confines it;
    at any depth, through predicates and negations (``not (a or b)`` as ``not a and not b``, ``not x != c`` as
    ``x == c``). Sound, not complete: a fact left out may still be confined."""
    return _implied(node, True, predicates, types, frozenset())


def _implied(node: ast.expr, positive: bool, predicates, types, inside: frozenset[str]) -> dict[str, frozenset[tuple]]:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _implied(node.operand, not positive, predicates, types, inside)
    if isinstance(node, ast.BoolOp):
        parts = [_implied(v, positive, predicates, types, inside) for v in node.values]
        if isinstance(node.op, ast.And) == positive:  # a conjunction (or a negated disjunction): each part holds
            return _meet(parts)
        first, *rest = parts  # a disjunction (or a negated conjunction): one part holds, whichever
        return {f: values.union(*(p[f] for p in rest)) for f, values in first.items() if all(f in p for p in rest)}
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = _name(node)
        if name in predicates:
            if name in inside:  # (predicates do not recurse; a guard all the same)
                return {}
            return _implied(predicates[name], positive, predicates, types, inside | {name})
        kind = types.get(name)
        if kind is None or kind.base != "bool" or (not positive and kind.optional):
            return {}
        return {name: frozenset({literal_key(positive)})}
    if isinstance(node, ast.Compare) and (positive or len(node.ops) == 1):
        parts, left = [], node.left
        for op, right in zip(node.ops, node.comparators):
            parts.append(_compared(left, op, right, positive, types))
            left = right
        return _meet(parts)
    return {}


def _meet(parts: list[dict[str, frozenset[tuple]]]) -> dict[str, frozenset[tuple]]:
    """What a conjunction of ``parts`` confines each fact to: the intersection of what the parts allow."""
    out: dict[str, frozenset[tuple]] = {}
    for part in parts:
        for fact, values in part.items():
            out[fact] = out[fact] & values if fact in out else values
    return out


def _compared(left: ast.expr, op: ast.cmpop, right: ast.expr, positive: bool, types) -> dict[str, frozenset[tuple]]:
    """What one comparison confines its fact to (its negation's, where not ``positive``): ``fact == c``, ``fact in
    (c, ...)``, ``fact is None`` (``!=``, ``not in``, ``is not`` negated). Nothing where a literal is one the fact's
    type cannot hold, or None beside other literals: left to the solver."""
    if isinstance(left, (ast.Name, ast.Attribute)) and isinstance(right, (ast.Constant, ast.Tuple, ast.List)):
        fact, other = _name(left), right
    elif (
        isinstance(right, (ast.Name, ast.Attribute))
        and isinstance(left, ast.Constant)
        and type(op) in (ast.Eq, ast.NotEq)
    ):
        fact, other = _name(right), left
    else:
        return {}
    kind = types.get(fact)
    confining = {True: (ast.Eq, ast.In, ast.Is), False: (ast.NotEq, ast.NotIn, ast.IsNot)}[positive]
    if kind is None or not isinstance(op, confining):
        return {}
    if isinstance(op, (ast.In, ast.NotIn)) != isinstance(other, (ast.Tuple, ast.List)):
        return {}
    elements = other.elts if isinstance(other, (ast.Tuple, ast.List)) else [other]
    if not all(isinstance(e, ast.Constant) for e in elements):
        return {}
    values = [e.value for e in elements]  # type: ignore[attr-defined]
    if isinstance(op, (ast.Is, ast.IsNot)) != (values == [None]) or (None in values and values != [None]):
        return {}  # `x is 3`, `x == None`, `x in (None, 1)`: left to the solver
    if not all(_fits(v, kind) for v in values):
        return {}  # a literal the fact's type cannot hold: left to the solver
    return {fact: frozenset(literal_key(v) for v in values)}


def _fits(value: Any, kind: FactType) -> bool:
    if value is None:
        return kind.optional
    if kind.base == "bool":
        return isinstance(value, bool)
    if kind.base in ("int", "float"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str) and kind.base == "str"


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{node.value.id}.{node.attr}"  # type: ignore[attr-defined]
    return node.id  # type: ignore[attr-defined]


class _Linked:
    """:func:`attngate.analysis.encoding.find` for a search of many queries over one set of assertions: two solvers
    kept for the whole search, each claim asserted under a fresh literal, checked with that literal as z3's assumption
    and then retired (its negation asserted): no push and pop, so z3 keeps what it learned. The claim is checked
    without the derived-fact links first (cheap; unsat or unknown there is the answer), then in the second solver,
    which holds the links from the start, so that z3 takes in their integer division once instead of at every query
    (on the shipped rules a sat query with its model costs ~11 ms this way, ~200 ms through find)."""

    def __init__(self, solver: z3.Solver, links: list[Any]):
        self.cheap = z3.Solver()
        self.cheap.add(*solver.assertions())
        self.links = links
        self.linked: z3.Solver | None = None
        self.count = 0

    def find(
        self, claim: Any, *, filtered: bool = True, model: bool = True
    ) -> tuple[Verdict, Callable[[], z3.ModelRef | None] | None]:
        """(verdict, witness) of the assertions and ``claim`` with the links: ``witness()`` the model (None unless
        sat). ``model`` False leaves it to be built when asked, by a query of its own (building one costs as much as
        a query, and most pairs never need theirs); ``filtered`` False skips the check without links (for a query
        expected sat)."""
        if filtered:
            verdict, _ = self._check(self.cheap, claim, False)
            if not verdict.sat:
                return verdict, None
        if self.linked is None:
            self.linked = z3.Solver()
            self.linked.add(*self.cheap.assertions(), *self.links)
        verdict, found = self._check(self.linked, claim, model)
        if not verdict.sat:
            return verdict, None
        return verdict, (lambda: found) if model else (lambda: self._check(self.linked, claim, True)[1])

    def _check(self, solver: z3.Solver, claim: Any, model: bool) -> tuple[Verdict, z3.ModelRef | None]:
        self.count += 1
        literal = z3.Bool(f"attngate:claim:{self.count}")
        solver.add(z3.Implies(literal, claim))
        try:
            verdict = check(solver, assume=(literal,))
            return verdict, solver.model() if model and verdict.sat else None
        finally:
            solver.add(z3.Not(literal))  # retired: z3 never reasons about this claim again


def clash_groups(
    classes: dict[str, list[Rule]],
    keys: Callable[[Rule], dict[str, frozenset[tuple]]],
    used: frozenset[str] = frozenset(),
) -> Iterator[tuple[list[str], list[str] | None]]:
    """Groups (a, b) of value classes such that every two classes that can match together meet in one group: ``b``
    None means two of ``a``, else one of ``a`` with one of ``b``. A class whose rules all confine one fact to a set of
    literals (``keys``, :func:`implied_values`; the class to their union) can meet only a class that allows one of
    them, so classes are split on that fact (recursively, the fact most classes confine first) into one bucket per
    literal, of the classes that allow it: each class is queried in as many groups as it allows literals, not against
    every other class."""
    if len(classes) < 2:
        return
    common: dict[str, dict[str, frozenset[tuple]]] = {}
    for value, rs in classes.items():
        confined = dict(keys(rs[0]))
        for r in rs[1:]:
            other = keys(r)
            confined = {f: values | other[f] for f, values in confined.items() if f in other}
        common[value] = confined
    counts: dict[str, int] = {}
    for confined in common.values():
        for fact in confined:
            if fact not in used:
                counts[fact] = counts.get(fact, 0) + 1
    fact = max(counts, key=counts.__getitem__, default=None)
    if fact is None or counts[fact] < 2:
        yield list(classes), None
        return
    buckets: dict[tuple, dict[str, list[Rule]]] = {}
    rest = {}
    for value, rs in classes.items():
        if fact not in common[value]:
            rest[value] = rs
        for literal in sorted(common[value].get(fact, ()), key=repr):  # none: the class never matches
            buckets.setdefault(literal, {})[value] = rs
    for bucket in buckets.values():
        yield from clash_groups(bucket, keys, used | {fact})
    if rest:
        yield from clash_groups(rest, keys, used | {fact})
        confined = dict.fromkeys(v for bucket in buckets.values() for v in bucket)  # each once, in order
        if confined:
            yield list(rest), list(confined)


def conflicts(
    rules: RuleSet, kind: str, values, cond: dict[str, Any], solver: z3.Solver, links: list[Any], unknown: list, enc
) -> Iterator[tuple[Rule, Rule, Any]]:
    """(a, b, witness) for rules a before b of one scope that can match together and give a name different values:
    every such pair, once; ``witness()`` is a model where both match (with the derived-fact links), built when
    asked. A query z3 cannot decide is appended to ``unknown`` (an :class:`Unknown` naming
    the rules). ``values`` maps a rule to its ``sets`` or ``adjusts``; ``enc`` is the encoder of ``cond``."""
    group = [r for r in rules.rules if (r.kind == "set") == (kind == "set") and values(r)]
    find = _Linked(solver, links).find
    position = {r.id: i for i, r in enumerate(group)}
    predicates = {p.name: p.condition.tree.body for p in rules.predicates}
    confined: dict[str, dict[str, frozenset[tuple]]] = {}

    def keys(rule: Rule) -> dict[str, frozenset[tuple]]:
        if rule.id not in confined:
            confined[rule.id] = implied_values(rule.condition.tree.body, predicates, enc.types)
        return confined[rule.id]

    by_name: dict[tuple[str, str], list[Rule]] = {}
    for r in group:
        for name in values(r):
            by_name.setdefault((r.scope, name), []).append(r)
    reported: set[tuple[str, str]] = set()  # a pair disagreeing on two names is yielded once
    for (_, name), setters in by_name.items():
        what = ("gate " if kind == "set" else "server argument ") + name
        classes: dict[str, list[Rule]] = {}
        for r in setters:
            classes.setdefault(repr(values(r)[name]), []).append(r)
        seen: set[tuple[str, str]] = set()  # the pairs found for this name

        def differ(a: Rule, b: Rule) -> bool:
            return values(a)[name] != values(b)[name]

        def live_pairs(witness, among: list[Rule]) -> Iterator[tuple[Rule, Rule, Any]]:
            """The pairs of ``among`` that both match in the model ``witness()`` and disagree, each new one marked
            seen (and yielded unless reported for another name). Two rules of different values, the claim's only
            ones, are that pair without the model."""
            if len(among) == 2 and differ(*among):  # (the claim was made without its model)
                live = among
            else:
                model = witness()  # just checked: its model is at hand
                live = [r for r in among if z3.is_true(model.eval(cond[r.id], model_completion=True))]
            for a, b in combinations(sorted(live, key=lambda r: position[r.id]), 2):
                if differ(a, b) and (a.id, b.id) not in seen:
                    seen.add((a.id, b.id))
                    if (a.id, b.id) not in reported:
                        reported.add((a.id, b.id))
                        yield a, b, witness

        def asked(ids: list[str]) -> str:
            listed = ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
            return f"can {kind} rules {listed} match together and disagree on {what}"

        for first, second in clash_groups(classes, keys):
            side_a = [r for v in first for r in classes[v]]
            side_b = [r for v in second for r in classes[v]] if second is not None else None
            members = side_a + (side_b or [])
            matches = [z3.Or(*[cond[r.id] for r in classes[v]]) for v in first]
            if side_b is None:
                clash = z3.AtLeast(*matches, 2)  # two value classes match: linear in the classes, not pairwise
            else:
                clash = z3.And(z3.Or(*matches), z3.Or(*[cond[r.id] for r in side_b]))
            verdict, witness = find(clash, model=len(members) > 2)
            if verdict.unknown:
                unknown.append(Unknown(side_a[0].where, asked([r.id for r in members]), verdict.reason))
            if witness is None:  # unsat: no two of the group match together (the common case: one query)
                continue
            yield from live_pairs(witness, members)
            if len(members) > 2:  # sat: one query per rule of the group's larger side finds every pair
                yield from _rule_by_rule(side_a, side_b, differ, cond, find, seen, position, live_pairs, asked, unknown)


def _rule_by_rule(side_a, side_b, differ, cond, find, seen, position, live_pairs, asked, unknown):
    """Every pair of the group not yet seen: each rule ``r`` of the larger side (for a group of one side: each rule,
    against the later ones of other values) against the disjunction of the rules it may conflict with, one query,
    repeated with the partners found taken out until unsat. Queries: one per rule plus at most one per conflicting
    pair, each model's other pairs taken too."""

    def pair(r: Rule, s: Rule) -> tuple[str, str]:
        return (r.id, s.id) if position[r.id] < position[s.id] else (s.id, r.id)

    if side_b is None:
        ordered = sorted(side_a, key=lambda r: position[r.id])
        plan = ((r, [s for s in ordered[i + 1 :] if differ(r, s)]) for i, r in enumerate(ordered))
    else:  # the sides hold different values
        larger, smaller = (side_a, side_b) if len(side_a) >= len(side_b) else (side_b, side_a)
        plan = ((r, smaller) for r in larger)
    for r, partners in plan:
        while partners := [s for s in partners if pair(r, s) not in seen]:
            claim = z3.And(cond[r.id], z3.Or(*[cond[s.id] for s in partners]))
            verdict, witness = find(claim, filtered=False, model=len(partners) > 1)
            if verdict.unknown:
                unknown.append(Unknown(r.where, asked([r.id] + [s.id for s in partners]), verdict.reason))
            if witness is None:
                break
            before = len(seen)
            yield from live_pairs(witness, [r, *partners])
            if len(seen) == before:  # cannot happen: the model makes r and a partner of another value match
                break
