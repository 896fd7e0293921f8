"""``attngate diff OLD NEW``: does some input make two rule files resolve differently, and where?

Both files are encoded as in the invariant proofs (attngate.analysis.prove) over one shared set of facts
and server arguments, each with its own gate variables. Three kinds of difference, each with a
witness input and the rules responsible on each side:

- acceptance: an input (settled under both files' adjust rules) that one file refuses and the other
  resolves;
- a gate, of any scope: an input both files resolve where the gate's values differ
  (``forward_mode`` and ``layer_kind`` are part of the input);
- an adjustment: a server argument that the two files' adjust rules rewrite differently for the same
  input (one step of adjustment).

A query z3 cannot decide (a timeout, an incomplete theory) is a difference of kind ``unknown`` naming what it
asked and z3's reason: never read as "no difference". SIGINT stops it with
:class:`~attngate.analysis.verdict.Interrupted`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import z3

from attngate.analysis.encoding import Encoder, find
from attngate.analysis.prove import (
    ResolutionModel,
    encode_resolution,
    inputs_read,
    model_value,
    simplest_witness,
    witness_inputs,
)
from attngate.analysis.verdict import Verdict, interruptible
from attngate.plan.registry import GATES
from attngate.rules.ruleset import Rule, RuleSet


@dataclass
class Difference:
    kind: str  # "acceptance" | "gate" | "adjustment" | "unknown"
    name: str  # the gate or server argument ("" for acceptance); for unknown what was asked of it
    old: Any
    new: Any
    old_rules: list[str]
    new_rules: list[str]
    witness: dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # z3's reason, for unknown

    def __str__(self) -> str:
        if self.kind == "unknown":
            question = f"do OLD and NEW differ on {self.name}?"
            return f"unknown: {question} z3 could not decide it ({self.reason}); not proved either way"
        what = {"acceptance": "accepted", "gate": f"gate {self.name}", "adjustment": f"adjusted {self.name}"}.get(
            self.kind, self.name
        )
        sides = f"old {self.old!r} ({', '.join(self.old_rules) or 'default'}), new {self.new!r} ({', '.join(self.new_rules) or 'default'})"
        inputs = ", ".join(f"{k}={v!r}" for k, v in self.witness.items())
        return f"{what}: {sides}; e.g. {inputs}"


class _Side:
    def __init__(self, rules: RuleSet, prefix: str):
        self.rules = rules
        self.enc = Encoder(rules, all_gates=True, gate_prefix=prefix)
        self.model: ResolutionModel = encode_resolution(self.enc, rules)

    def rules_by_id(self, ids: list[str]) -> list[Rule]:
        return [r for r in self.rules.rules if r.id in ids]

    def fired(self, model: z3.ModelRef, kinds: tuple[str, ...], gate: str | None = None) -> list[str]:
        return [
            r.id
            for r in self.rules.rules
            if r.kind in kinds
            and (gate is None or gate in r.sets or gate in r.adjusts)
            and z3.is_true(model.eval(self.model.cond[r.id], model_completion=True))
        ]


def diff_rules(old: RuleSet, new: RuleSet, *, timeout_ms: int = 10_000) -> list[Difference]:
    """Every difference between ``old`` and ``new`` (empty: they resolve every input alike), and one of kind
    ``unknown`` per query z3 could not decide within ``timeout_ms``. Raises
    :class:`~attngate.analysis.verdict.Interrupted` on SIGINT (:func:`interruptible`)."""
    with interruptible():
        return _diff(old, new, timeout_ms)


def _unknown(what: str, verdict: Verdict) -> list[Difference]:
    return [Difference("unknown", what, None, None, [], [], {}, verdict.reason)] if verdict.unknown else []


def _diff(old: RuleSet, new: RuleSet, timeout_ms: int) -> list[Difference]:
    a, b = _Side(old, "old:"), _Side(new, "new:")
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*a.enc.axioms, *b.enc.axioms, *a.model.settled, *b.model.settled, *a.model.gates, *b.model.gates)
    out = []
    claim = a.model.accepted != b.model.accepted
    verdict, m = find(solver, claim, a.enc.links)
    out += _unknown("acceptance", verdict)
    if m is not None:
        refusals = [
            *a.rules_by_id(a.fired(m, ("forbid", "known_failure"))),
            *b.rules_by_id(b.fired(m, ("forbid", "known_failure"))),
        ]
        m, inputs = _witness(solver, [claim], m, a, b, refusals)
        ok_a = z3.is_true(m.eval(a.model.accepted, model_completion=True))
        out.append(
            Difference(
                "acceptance",
                "",
                ok_a,
                not ok_a,
                a.fired(m, ("forbid", "known_failure")),
                b.fired(m, ("forbid", "known_failure")),
                inputs,
            )
        )
    solver.add(a.model.accepted, b.model.accepted)
    for name in GATES:
        (va, na), (vb, nb) = a.enc.var(name), b.enc.var(name)
        differs = z3.Or(na != nb, z3.And(z3.Not(na), va != vb))
        verdict, m = find(solver, differs, a.enc.links)
        out += _unknown(f"gate {name}", verdict)
        if m is not None:
            m, inputs = _witness(
                solver, [differs], m, a, b, [r for side in (a, b) for r in side.rules.rules if name in r.sets]
            )
            out.append(
                Difference(
                    "gate",
                    name,
                    model_value(m, va, na),
                    model_value(m, vb, nb),
                    a.fired(m, ("set",), name),
                    b.fired(m, ("set",), name),
                    inputs,
                )
            )
    out += _adjust_differences(a, b, timeout_ms)
    return out


def _adjust_differences(a: _Side, b: _Side, timeout_ms: int) -> list[Difference]:
    fields = sorted({f for side in (a, b) for r in side.rules.rules for f in r.adjusts})
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*a.enc.axioms, *b.enc.axioms)
    out = []
    for name in fields:
        value, none = a.enc.var(name)
        results = []
        for side in (a, b):  # the value after one step: the first matching adjust rule's, else the input
            v_expr, n_expr = value, none
            for rule in reversed([r for r in side.rules.rules if name in r.adjusts]):
                new_value, new_none = side.enc.term(name, rule.adjusts[name])
                v_expr = z3.If(side.model.cond[rule.id], new_value, v_expr)
                n_expr = z3.If(side.model.cond[rule.id], new_none, n_expr)
            results.append((v_expr, n_expr))
        (va, na), (vb, nb) = results
        differs = z3.Or(na != nb, z3.And(z3.Not(na), va != vb))
        verdict, m = find(solver, differs, a.enc.links)
        out += _unknown(f"adjusted {name}", verdict)
        if m is not None:
            m, inputs = _witness(
                solver, [differs], m, a, b, [r for side in (a, b) for r in side.rules.rules if name in r.adjusts]
            )
            out.append(
                Difference(
                    "adjustment",
                    name,
                    model_value(m, va, na),
                    model_value(m, vb, nb),
                    a.fired(m, ("adjust",), name),
                    b.fired(m, ("adjust",), name),
                    inputs,
                )
            )
    return out


def _witness(
    solver: z3.Solver, terms: list[Any], model: z3.ModelRef, a: _Side, b: _Side, rules: list[Rule]
) -> tuple[z3.ModelRef, dict[str, Any]]:
    """The witness to show (server arguments not read by ``rules`` left at their defaults where they can be) and
    its inputs that explain the difference (:func:`inputs_read`)."""
    keep = inputs_read([a.rules, b.rules], rules)
    model = simplest_witness(solver, a.enc, terms, model, keep)
    return model, witness_inputs(a.enc, model, keep)
