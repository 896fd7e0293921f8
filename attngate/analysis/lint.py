"""Static analysis of a loaded rule set with the z3 SMT solver (encoding: attngate.analysis.encoding).

Findings (each names the rules and a witness configuration):

- two ``set`` rules of one gate with different values that can match together (and no forbid
  rule rejects that configuration): a conflict that would otherwise surface only when some
  configuration meets it;
- two ``adjust`` rules that can ask one server argument for different values in the same round
  (again unless a forbid rule rejects every such configuration);
- a rule (or predicate) whose condition can never be true;
- a deviation (``deviations:``) whose condition can never be true, or two that can hold together and
  declare the same field (for refusals: the same refusing rule), or one of values whose condition is always true
  (attngate.analysis.deviation_lint);
- an invariant (``invariants:``) that some accepted input violates, with the counterexample
  (attngate.analysis.prove).

A query z3 cannot decide (a timeout, an incomplete theory) is never read as "no finding": it comes back as an
:class:`~attngate.analysis.verdict.Unknown` naming what it asked. SIGINT stops the analysis with
:class:`~attngate.analysis.verdict.Interrupted`.

Model facts are free, so a finding can be a combination no released model has: the witness shows it,
with the facts that explain it and the server arguments it needs.
"""

from __future__ import annotations

import functools
from itertools import combinations
from typing import Any

import z3

from attngate.analysis.conflicts import conflicts
from attngate.analysis.deviation_lint import lint_tautologies
from attngate.analysis.encoding import Encoder, Finding, can_hold, find, satisfiable
from attngate.analysis.prove import (
    ReadIndex,
    inputs_read,
    prove_invariants,
    simplest_witness,
    witness_inputs,
)
from attngate.analysis.verdict import Unknown, Verdict, interruptible
from attngate.facts.catalogue import FACTS
from attngate.rules.ruleset import FactValue, Rule, RuleSet


def lint_rules(rules: RuleSet) -> list[Finding | Unknown]:
    """Every static finding of ``rules`` (see the module doc), and an :class:`Unknown` per query z3 could not
    decide. Raises :class:`~attngate.analysis.verdict.Interrupted` on SIGINT (:func:`interruptible`).

    Solver calls grow linearly with the rules: conflicts are found by one query per gate or argument and group of
    value classes that can meet (attngate.analysis.conflicts; then about one per rule of a group that holds
    conflicts), never by checking every pair of rules.
    """
    with interruptible():
        return _lint(rules)


def _dead(where: str, what: str, verdict: Verdict, never: str, code: str) -> list[Finding | Unknown]:
    """The finding (of kind ``code``) of a condition that can never hold (unsat), or the Unknown of one z3 could
    not decide."""
    if verdict.unsat:
        return [Finding(where, f"{what} can never {never}", code)]
    return [Unknown(where, f"can {what} {never}", verdict.reason)] if verdict.unknown else []


def _lint(rules: RuleSet) -> list[Finding | Unknown]:
    enc = Encoder(rules, all_gates=True)  # the invariant proofs below read gates of every scope
    cond = {r.id: enc.encode(r.condition.tree.body) for r in rules.rules}
    solver = z3.Solver()
    solver.add(*enc.axioms)
    accepted = z3.Solver()  # configurations resolve() does not reject outright
    accepted.add(
        *enc.axioms,
        *[z3.Not(cond[r.id]) for r in rules.rules if r.kind in ("forbid", "known_failure") and not r.adjusts],
    )

    findings: list[Finding | Unknown] = []
    plain = ReadIndex.of([rules], through_gates=False)  # one index for every rule and predicate, not one each
    for p in rules.predicates:
        reads = plain.inputs_read([], (p.name,))
        verdict = can_hold(solver, enc, enc.encode(p.condition.tree.body), reads)
        findings += _dead(p.where, f"predicate {p.name!r}", verdict, "be true", "lint.dead-predicate")
    for rule in rules.rules:
        verdict = can_hold(solver, enc, cond[rule.id], plain.inputs_read([rule]))
        findings += _dead(rule.where, f"rule {rule.id!r}", verdict, "match", "lint.dead-rule")
    for kind, values in (("set", lambda r: r.sets), ("adjust", lambda r: r.adjusts)):
        by_name: dict[tuple[str, ...], list[tuple[Rule, Rule, Any]]] = {}
        for a, b, witness in conflicts(rules, kind, values, cond, accepted, enc.links, findings, enc):
            names = tuple(n for n in values(a) if n in values(b) and values(a)[n] != values(b)[n])
            by_name.setdefault(names, []).append((a, b, witness))
        for names, pairs in by_name.items():  # one finding per gate: a rule base can hold thousands of pairs
            a, b, first = pairs[0]
            what = ("gate " if kind == "set" else "server argument ") + ", ".join(names)
            keep = inputs_read([rules], [a, b])
            witness = simplest_witness(accepted, enc, [cond[a.id], cond[b.id]], first(), keep)
            shown = ", ".join(f"{n}={v!r}" for n, v in witness_inputs(enc, witness, keep).items())
            if len(pairs) == 1:
                message = f"{kind} rules {a.id!r} and {b.id!r} can both match and disagree on {what}; e.g. {shown}"
            else:
                listed = "; ".join(f"{x.id} / {y.id}" for x, y, _ in pairs)
                message = (
                    f"{len(pairs)} pairs of {kind} rules can both match and disagree on {what}: {listed}; "
                    f"e.g. {a.id} / {b.id} with {shown}"
                )
            findings.append(Finding(b.where, message, f"lint.{kind}-conflict"))

    findings += _adjust_cycles(rules, enc, cond)
    findings += _lint_deviations(rules, enc, solver) + lint_tautologies(rules, enc, solver)
    return findings + prove_invariants(rules, encoded=(enc, cond))


def _adjust_cycles(rules: RuleSet, enc: Encoder, cond: dict[str, Any]) -> list[Finding | Unknown]:
    """Two adjust rules that undo each other: A writes argument x to a where B's condition holds once x is a, and B
    writes x back to b where A's holds once x is b; resolve() would rewrite forever (it stops with an
    oscillation). One query per pair of rules giving one argument different constant values, over two states that
    agree on every input but x (a second encoding of the facts, derived facts recomputed in each state)."""
    writers: dict[str, list[Rule]] = {}
    for r in rules.rules:
        for name, value in r.adjusts.items():
            if not isinstance(value, FactValue):
                writers.setdefault(name, []).append(r)
    forbids = [z3.Not(cond[r.id]) for r in rules.rules if r.kind in ("forbid", "known_failure") and not r.adjusts]
    given, later = z3.Solver(), z3.Solver()  # one state alone, the cheap filter: as given (not refused), any
    given.add(*enc.axioms, *forbids)
    later.add(*enc.axioms)

    @functools.cache
    def can_fire(state: str, rule_id: str, name: str, value: Any) -> bool:
        """Whether rule ``rule_id`` may match while argument ``name`` holds ``value`` in ``state`` (given, later):
        sat, or unknown (the pair is then queried in full, and reported unknown if that is undecided too)."""
        return not satisfiable(given if state == "given" else later, cond[rule_id], enc.equals(name, value)).unsat

    predicates = {p.name: p.condition.reads for p in rules.predicates}

    def may_read(rule: Rule, name: str) -> bool:
        """Whether ``rule``'s condition can depend on argument ``name`` (through predicates; a derived fact counts as
        depending on everything). One that does not fires in both states alike, so it cannot take part."""
        seen, stack = set(), list(rule.condition.reads)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n == name or (n in FACTS and FACTS[n].origin == "derived"):
                return True
            stack += predicates.get(n, ())
        return False

    pairs = [
        (name, a, b)
        for name, rs in writers.items()
        for x, y in combinations([r for r in rs if may_read(r, name)], 2)
        if x.adjusts[name] != y.adjusts[name]
        for a, b in ((x, y), (y, x))
        if can_fire("given", a.id, name, b.adjusts[name]) and can_fire("later", b.id, name, a.adjusts[name])
    ]
    if not pairs:
        return []
    after = Encoder(rules, state_prefix="after:")  # adjust conditions read no gates
    cond_after = {r.id: after.encode(r.condition.tree.body) for r in rules.rules if r.adjusts}
    inputs = [n for n, f in FACTS.items() if f.origin in ("server_args", "model", "platform")]
    frame = {n: z3.And(enc.var(n)[0] == after.var(n)[0], enc.var(n)[1] == after.var(n)[1]) for n in inputs}
    solver = z3.Solver()  # the state a user gives is one resolve() does not refuse outright (as for conflicts)
    solver.add(*enc.axioms, *after.axioms, *forbids)
    findings: list[Finding | Unknown] = []
    found = set()
    for name, a, b in pairs:
        if (name, frozenset((a.id, b.id))) in found:  # one finding per pair, whichever way it turns
            continue
        # state 1: x == b (B's value), A fires and B does not; state 2: x == a (A's value), B fires and A does not
        same = [frame[n] for n in inputs if n != name]
        claim = z3.And(
            enc.equals(name, b.adjusts[name]),
            after.equals(name, a.adjusts[name]),
            cond[a.id],
            z3.Not(cond[b.id]),
            cond_after[b.id],
            z3.Not(cond_after[a.id]),
            *same,
        )
        verdict, model = find(solver, claim, enc.links + after.links)
        if verdict.unknown:
            findings.append(
                Unknown(b.where, f"do adjust rules {a.id!r} and {b.id!r} undo each other on {name}", verdict.reason)
            )
        if model is not None:
            found.add((name, frozenset((a.id, b.id))))
            findings.append(
                Finding(
                    b.where,
                    f"adjust rules {a.id!r} and {b.id!r} undo each other: {a.id} sets {name} to "
                    f"{a.adjusts[name]!r} where {b.id} then sets it back to {b.adjusts[name]!r}, and so on "
                    "(resolve() stops with an oscillation)",
                    "lint.adjust-cycle",
                )
            )
    return findings


def _lint_deviations(rules: RuleSet, enc: Encoder, solver: z3.Solver) -> list[Finding | Unknown]:
    """A deviation that can never hold, and two that can hold together and declare one field (refusal deviations
    of attngate's refusals: through one refusing rule both name). Pairwise over the file's few deviations."""
    findings: list[Finding | Unknown] = []
    held = []
    plain = ReadIndex.of([rules], through_gates=False)
    for deviation in rules.deviations:
        condition = enc.encode(deviation.condition.tree.body)
        reads = plain.inputs_read([], deviation.condition.reads)
        verdict = can_hold(solver, enc, condition, reads)
        findings += _dead(deviation.where, f"deviation {deviation.id!r}", verdict, "hold", "lint.dead-deviation")
        if not verdict.unsat:  # an undecided one may hold: its pairs are still checked
            held.append((deviation, condition))
    for (a, cond_a), (b, cond_b) in combinations(held, 2):
        # two deviations declare one attngate refusal only through a rule both name
        shared = [f for f in a.fields if f in b.fields and (f != "refusal" or set(a.rules) & set(b.rules))]
        if not shared:
            continue
        reads = plain.inputs_read([], (*a.condition.reads, *b.condition.reads))
        verdict = can_hold(solver, enc, z3.And(cond_a, cond_b), reads)
        if verdict.unknown:
            query = f"can deviations {a.id!r} and {b.id!r} hold together (both declare {', '.join(shared)})"
            findings.append(Unknown(b.where, query, verdict.reason))
        elif verdict.sat:
            findings.append(
                Finding(
                    b.where,
                    f"deviations {a.id!r} and {b.id!r} both declare {', '.join(shared)} "
                    "for some configuration; one deviation per difference",
                    "lint.deviation-overlap",
                )
            )
    return findings
