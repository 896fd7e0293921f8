"""Static analysis of a loaded rule set with the z3 SMT solver (encoding: attngate.analysis.encoding).

Findings (each names the rules and a witness configuration):

- two ``set`` rules of one gate with different values that can match together (and no forbid
  rule rejects that configuration): a conflict that would otherwise surface only when some
  configuration meets it;
- two ``adjust`` rules that can ask one server argument for different values in the same round
  (again unless a forbid rule rejects every such configuration);
- a rule (or predicate) whose condition can never be true;
- a deviation (``deviations:``) whose condition can never be true, or two that can hold together and
  declare the same field (for refusals: the same refusing rule);
- an invariant (``invariants:``) that some accepted input violates, with the counterexample
  (attngate.analysis.prove).

Model facts are free, so a finding can be a combination no released model has: the witness shows it,
with the facts that explain it and the server arguments it needs.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import z3

from attngate.analysis.encoding import Encoder, Finding, can_hold, find
from attngate.analysis.prove import (
    inputs_read,
    prove_invariants,
    simplest_witness,
    witness_inputs,
)
from attngate.rules.ruleset import Rule, RuleSet


def lint_rules(rules: RuleSet) -> list[Finding]:
    """Every static finding of ``rules`` (see the module doc).

    Solver calls grow linearly with the rules: conflicts are found by one query per gate or
    argument (then one more per conflict found), never by checking every pair of rules.
    """
    enc = Encoder(rules, all_gates=True)  # the invariant proofs below read gates of every scope
    cond = {r.id: enc.encode(r.condition.tree.body) for r in rules.rules}
    solver = z3.Solver()
    solver.add(*enc.axioms)
    accepted = z3.Solver()  # configurations resolve() does not reject outright
    accepted.add(
        *enc.axioms,
        *[z3.Not(cond[r.id]) for r in rules.rules if r.kind in ("forbid", "known_failure") and not r.adjusts],
    )

    findings: list[Finding] = []
    for p in rules.predicates:
        if not can_hold(
            solver, enc, enc.encode(p.condition.tree.body), inputs_read([rules], [], (p.name,), through_gates=False)
        ):
            findings.append(Finding(p.where, f"predicate {p.name!r} can never be true"))
    for rule in rules.rules:
        if not can_hold(solver, enc, cond[rule.id], inputs_read([rules], [rule], through_gates=False)):
            findings.append(Finding(rule.where, f"rule {rule.id!r} can never match"))
    for kind, values in (("set", lambda r: r.sets), ("adjust", lambda r: r.adjusts)):
        for a, b, model in _conflicts(rules, kind, values, cond, accepted, enc.links):
            names = [n for n in values(a) if n in values(b) and values(a)[n] != values(b)[n]]
            what = "gate" if kind == "set" else "server argument"
            keep = inputs_read([rules], [a, b])
            witness = simplest_witness(accepted, enc, [cond[a.id], cond[b.id]], model, keep)
            shown = ", ".join(f"{n}={v!r}" for n, v in witness_inputs(enc, witness, keep).items())
            findings.append(
                Finding(
                    b.where,
                    f"{kind} rules {a.id!r} and {b.id!r} can both match and disagree on "
                    f"{what} {', '.join(names)}; e.g. {shown}",
                )
            )

    return findings + _lint_deviations(rules, enc, solver) + prove_invariants(rules, encoded=(enc, cond))


def _lint_deviations(rules: RuleSet, enc: Encoder, solver: z3.Solver) -> list[Finding]:
    """A deviation that can never hold, and two that can hold together and declare one field (refusal deviations
    of attngate's refusals: through one refusing rule both name). Pairwise over the file's few deviations."""
    findings: list[Finding] = []
    held = []
    for deviation in rules.deviations:
        condition = enc.encode(deviation.condition.tree.body)
        if can_hold(solver, enc, condition, inputs_read([rules], [], deviation.condition.reads, through_gates=False)):
            held.append((deviation, condition))
        else:
            findings.append(Finding(deviation.where, f"deviation {deviation.id!r} can never hold"))
    for (a, cond_a), (b, cond_b) in combinations(held, 2):
        # two deviations declare one attngate refusal only through a rule both name
        shared = [f for f in a.fields if f in b.fields and (f != "refusal" or set(a.rules) & set(b.rules))]
        if shared and can_hold(
            solver,
            enc,
            z3.And(cond_a, cond_b),
            inputs_read([rules], [], (*a.condition.reads, *b.condition.reads), through_gates=False),
        ):
            findings.append(
                Finding(
                    b.where,
                    f"deviations {a.id!r} and {b.id!r} both declare {', '.join(shared)} "
                    "for some configuration; one deviation per difference",
                )
            )
    return findings


def _conflicts(rules: RuleSet, kind: str, values, cond: dict[str, Any], solver: z3.Solver, links: list[Any]):
    """(a, b, witness model) for rules a before b of one scope that can match together and give a name
    different values. Per name one query over its value classes (at least two of them match: a cardinality
    constraint, linear in the classes), then one more per conflict found: linear in the rules, not pairwise."""
    group = [r for r in rules.rules if (r.kind == "set") == (kind == "set") and values(r)]
    position = {r.id: i for i, r in enumerate(group)}
    by_name: dict[tuple[str, str], list[Rule]] = {}
    for r in group:
        for name in values(r):
            by_name.setdefault((r.scope, name), []).append(r)
    seen: set[tuple[str, str]] = set()
    for (_, name), setters in by_name.items():
        classes: dict[str, list[Rule]] = {}
        for r in setters:
            classes.setdefault(repr(values(r)[name]), []).append(r)
        if len(classes) < 2:
            continue
        matches = {v: z3.Or(*[cond[r.id] for r in rs]) for v, rs in classes.items()}
        blocked: list[Any] = []
        while True:
            clash = z3.AtLeast(*matches.values(), 2)  # two value classes match: linear in the classes, not pairwise
            _, model = find(solver, z3.And(clash, *blocked), links)
            if model is None:
                break
            live = [r for r in setters if z3.is_true(model.eval(cond[r.id], model_completion=True))]
            pairs = [
                (a, b)
                for a, b in combinations(sorted(live, key=lambda r: position[r.id]), 2)
                if values(a)[name] != values(b)[name]
            ]
            for a, b in pairs:
                if (a.id, b.id) not in seen:
                    seen.add((a.id, b.id))
                    yield a, b, model
            blocked += [z3.Not(z3.And(cond[a.id], cond[b.id])) for a, b in pairs]
