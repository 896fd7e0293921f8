"""Proofs of the rule file's invariants with z3: each must hold for every input the fact schema allows.

The encoding mirrors resolve() (attngate/engine/resolve.py) over every input it accepts:

- facts and server arguments are free within their types and choices (model facts included, so a
  counterexample may be a combination no shipped config has: it is printed in full);
- the arguments are a fixed point of the adjust rules (no adjust rule that matches would change
  one), no forbid or known_failure rule matches, and both backends are chosen: the states from
  which resolve() returns a Plan;
- every gate, of every scope, equals the value of the set rule that matches (no two matching set
  rules disagree: that is a conflict, reported by lint on its own), else its default or fact;
- ``forward_mode`` and ``layer_kind`` are free, so an invariant holds for every mode and layer kind.

An invariant that fails comes back with a counterexample: the input, the gates the invariant reads
with the rules that set them, and the invariant's location.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from attngate.analysis.encoding import Encoder, Finding, find, lit
from attngate.analysis.verdict import Unknown, check, interruptible
from attngate.facts.server_args import ServerArgs
from attngate.plan.registry import GATES
from attngate.rules.load import Invariant
from attngate.rules.ruleset import FactValue, Rule, RuleSet


def prove_invariants(
    rules: RuleSet, *, timeout_ms: int = 10_000, encoded: tuple[Encoder, dict[str, Any]] | None = None
) -> list[Finding | Unknown]:
    """One finding per invariant that some accepted input violates, one :class:`Unknown` per invariant z3 cannot
    decide in time. ``encoded``: an encoder over all gates and its rule conditions by id, where the caller (lint)
    has them. Raises :class:`~attngate.analysis.verdict.Interrupted` on SIGINT (:func:`interruptible`)."""
    if not rules.invariants:
        return []
    with interruptible():
        return _prove(rules, timeout_ms, encoded)


def _prove(rules: RuleSet, timeout_ms: int, encoded: tuple[Encoder, dict[str, Any]] | None) -> list[Finding | Unknown]:
    enc, cond = encoded or (Encoder(rules, all_gates=True), None)
    model = encode_resolution(enc, rules, cond)
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*enc.axioms, *model.settled, model.accepted, *model.gates)
    setters, cond = model.setters, model.cond
    findings: list[Finding | Unknown] = []
    for inv in rules.invariants:
        violated = z3.Not(enc.encode(inv.condition.tree.body))
        verdict, counter = find(solver, violated, enc.links)
        if counter is not None:
            keep = inputs_read([rules], [], inv.condition.reads)
            witness = simplest_witness(solver, enc, [violated], counter, keep)
            findings.append(
                Finding(inv.where, _counterexample(inv, enc, witness, setters, cond, keep), "lint.invariant-violated")
            )
        elif verdict.unknown:
            query = f"does invariant {inv.id!r} hold for every accepted input (within {timeout_ms} ms)"
            findings.append(Unknown(inv.where, query, verdict.reason))
    return findings


@dataclass
class ResolutionModel:
    """resolve() in z3 for one rule file: ``cond`` per rule, ``settled`` (the arguments are a fixed point of
    the adjust rules, both backends chosen), ``accepted`` (no forbid or known_failure rule matches) and
    ``gates`` (every gate of every scope equals what its matching set rule gives, else its default)."""

    cond: dict[str, Any]
    settled: list[Any]
    accepted: Any
    gates: list[Any]
    setters: dict[str, list]


def encode_resolution(enc: Encoder, rules: RuleSet, cond: dict[str, Any] | None = None) -> ResolutionModel:
    cond = cond or {r.id: enc.encode(r.condition.tree.body) for r in rules.rules}
    settled = [
        z3.Implies(cond[r.id], z3.And(*[enc.equals(a, v) for a, v in r.adjusts.items()]))
        for r in rules.rules
        if r.adjusts
    ]
    settled += [z3.Not(enc.var(side)[1]) for side in ("prefill_backend", "decode_backend")]
    accepted = z3.And(
        *[z3.Not(cond[r.id]) for r in rules.rules if r.kind in ("forbid", "known_failure") and not r.adjusts]
    )
    setters: dict[str, list] = {}
    for rule in rules.of_kind("set"):
        for gate in rule.sets:
            setters.setdefault(gate, []).append(rule)
    gates = [d for name in GATES for d in _define_gate(enc, name, setters.get(name, []), cond)]
    return ResolutionModel(cond, settled, accepted, gates, setters)


def _define_gate(enc: Encoder, name: str, rules: list, cond: dict[str, Any]) -> list[Any]:
    spec = GATES[name]
    value, none = enc.var(name)
    if spec.from_fact:
        default_value, default_none = enc.var(spec.from_fact)
    else:
        default_value, default_none = (
            (value, z3.BoolVal(True)) if spec.default is None else (lit(spec.default), z3.BoolVal(False))
        )
    v_expr, n_expr = default_value, default_none
    for rule in reversed(rules):
        new = rule.sets[name]
        v_expr = z3.If(cond[rule.id], value if new is None else lit(new), v_expr)
        n_expr = z3.If(cond[rule.id], z3.BoolVal(new is None), n_expr)
    out = [value == v_expr, none == n_expr]
    classes: dict[str, list] = {}  # no two matching rules give different values (that is a conflict, not a plan)
    for rule in rules:
        classes.setdefault(repr(rule.sets[name]), []).append(cond[rule.id])
    if len(classes) > 1:  # at most one value class matches: one cardinality constraint, not a clause per pair
        out.append(z3.AtMost(*[z3.Or(*conds) for conds in classes.values()], 1))
    if spec.from_fact and not spec.type.optional:  # resolve() refuses a fact-filled gate left None
        out.append(z3.Not(n_expr))
    return out


def inputs_read(
    rule_sets: list[RuleSet], rules: list[Rule], names: tuple[str, ...] = (), *, through_gates: bool = True
) -> set[str]:
    """The facts and server arguments that ``rules`` and ``names`` read, through the predicates and (``through_gates``)
    the gates they read and those gates' set rules (in any of ``rule_sets``), and the arguments the rules adjust: what
    a witness must show to explain a finding. Gates and predicates themselves are left out. A caller asking for many
    rules of the same sets builds one :class:`ReadIndex` instead (this builds one per call)."""
    return ReadIndex.of(rule_sets, through_gates=through_gates).inputs_read(rules, names)


@dataclass(frozen=True)
class ReadIndex:
    """What :func:`inputs_read` looks up, built once for a search over many rules: each predicate's reads, and each
    gate's set rules (none without ``through_gates``)."""

    predicates: dict[str, tuple[str, ...]]
    setters: dict[str, list[Rule]]

    @classmethod
    def of(cls, rule_sets: list[RuleSet], *, through_gates: bool = True) -> ReadIndex:
        setters: dict[str, list[Rule]] = {}
        for rs in rule_sets if through_gates else []:
            for r in rs.rules:
                for gate in r.sets:
                    setters.setdefault(gate, []).append(r)
        return cls({p.name: tuple(p.condition.reads) for rs in rule_sets for p in rs.predicates}, setters)

    def inputs_read(self, rules: list[Rule], names: tuple[str, ...] = ()) -> set[str]:
        """:func:`inputs_read` of ``rules`` and ``names`` over this index's rule sets."""
        seen: set[str] = set()
        stack, todo, done = list(names), list(rules), set()
        while stack or todo:
            if not stack:
                rule = todo.pop()
                if id(rule) not in done:
                    done.add(id(rule))
                    stack += [
                        *rule.condition.reads,
                        *rule.adjusts,
                        *(v.fact for v in rule.adjusts.values() if isinstance(v, FactValue)),
                    ]
                continue
            name = stack.pop()
            if name not in seen:
                seen.add(name)
                stack += self.predicates.get(name, ())
                todo += self.setters.get(name, [])
        return {n for n in seen if n not in GATES and n not in self.predicates}


def model_value(model: z3.ModelRef, value: Any, none: Any) -> Any:
    """The Python value (None, bool, int, float, str) a z3 model gives a fact's (value, is-None) pair."""
    if z3.is_true(model.eval(none, model_completion=True)):
        return None
    v = model.eval(value, model_completion=True)
    if z3.is_string_value(v):
        return v.as_string()
    if z3.is_true(v) or z3.is_false(v):
        return z3.is_true(v)
    if z3.is_int_value(v):
        return v.as_long()
    if z3.is_rational_value(v):
        return float(v.as_fraction())
    return str(v)


#: z3 resource units one check of a simplest witness may spend: a budget of work, not of time, so that a loaded host
#: shows the witness an idle one does
WITNESS_RLIMIT = 20_000_000


def simplest_witness(
    solver: z3.Solver, enc: Encoder, terms: list[Any], model: z3.ModelRef, keep: set[str], timeout_ms: int = 60_000
) -> z3.ModelRef:
    """A model of the solver's assertions, ``terms`` and the derived-fact links that sets the fewest server arguments
    outside ``keep`` away from their defaults, so that a witness shows only the flags it needs; among those, each
    argument in ``ServerArgs``' order keeps its default where it can given the ones before it.

    Both steps follow from sat/unsat answers alone (the least count by a cardinality bound raised from 0; then the
    arguments greedily, each default an assumption), so which arguments a witness sets is the same whatever z3 did
    before in this process (z3's Optimize, a MaxSAT search, swung from 2 to past 20 million resource units on one
    query with the terms' ids, and gave up unseen past its budget); the values it gives them are z3's choice.
    ``model`` where a check ends unknown (:data:`WITNESS_RLIMIT` or ``timeout_ms``). Raises
    :class:`~attngate.analysis.verdict.Interrupted` on SIGINT."""
    s = z3.Solver()
    s.set("rlimit", WITNESS_RLIMIT)
    s.set("timeout", timeout_ms)
    s.add(*solver.assertions(), *terms, *enc.links)
    defaults = {
        z3.FreshBool(f"default.{name}"): enc.equals(name, field.default)
        for name, field in ServerArgs.model_fields.items()
        if name not in keep
    }
    if not defaults:  # every argument is one the witness must show
        return model
    s.add(*(at_default == default for at_default, default in defaults.items()))
    away = [z3.Not(at_default) for at_default in defaults]
    bound = 0
    while not (verdict := check(s, z3.AtMost(*away, bound))).sat:
        if verdict.unknown or bound >= len(away):
            return model
        bound += 1
    s.add(z3.AtMost(*away, bound))
    if not check(s).sat:
        return model
    held: list[Any] = []
    found = s.model()  # a model of s and every literal held
    for at_default in defaults:
        if not z3.is_true(found.eval(at_default, model_completion=True)):  # else sat, as found shows: no check
            verdict = check(s, assume=(*held, at_default))
            if verdict.unknown:
                return model
            if verdict.unsat:
                continue
            found = s.model()
        held.append(at_default)
    return found


def witness_inputs(enc: Encoder, model: z3.ModelRef, names: set[str]) -> dict[str, Any]:
    """The witness's values of ``names`` (what explains a finding, :func:`inputs_read`) and of every other server
    argument it sets away from its default, so that the flags shown reproduce it."""
    values = {n: model_value(model, *enc.var(n)) for n in names if n in enc.types}
    for name, field in ServerArgs.model_fields.items():
        value = model_value(model, *enc.var(name))
        if name not in values and value != field.default:
            values[name] = value
    return dict(sorted(values.items()))


def _counterexample(
    inv: Invariant, enc: Encoder, model: z3.ModelRef, setters: dict[str, list], cond: dict[str, Any], reads: set[str]
) -> str:
    def show(name: str) -> str:
        return repr(model_value(model, *enc.var(name)))

    gates = [n for n in inv.condition.reads if n in GATES]
    facts = witness_inputs(enc, model, reads - {"prefill_backend", "decode_backend"})
    fired = {
        g: [r.id for r in setters.get(g, []) if z3.is_true(model.eval(cond[r.id], model_completion=True))]
        for g in gates
    }
    gate_text = "; ".join(f"{g} = {show(g)} ({', '.join(fired[g]) or 'default'})" for g in gates)
    input_text = ", ".join(f"{n}={v!r}" for n, v in facts.items())
    return (
        f"invariant {inv.id!r} does not hold ({inv.summary}). Counterexample: {gate_text}; "
        f"backends {show('prefill_backend')}/{show('decode_backend')}; input: {input_text}"
    )
