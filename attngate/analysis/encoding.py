"""The z3 encoding of facts, server arguments, gates and rule conditions, shared by lint, the invariant
proofs (prove) and diff.

Facts are encoded exactly as the conditions read them: bools, integers and strings, each optional
fact with a "is None" flag; ``prefill_backend``/``decode_backend`` follow from the three backend
arguments; ``gpu_arch`` and ``sm_major`` agree; the derived facts (``attn_tp_size``, the speculative
step counts, ...) and what ModelFacts guarantees of its own (``use_mla`` exactly with ``kv_lora_rank``)
are defined as resolve() computes them (:attr:`Encoder.links`, joined to a query once it found a
witness). Model facts are otherwise free, so a witness can be a combination no released model has.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

import z3

from attngate.analysis.verdict import Verdict, check
from attngate.facts.catalogue import FACTS, LAYER_FACT, MODE_FACT
from attngate.facts.derived import DERIVED_FACTS
from attngate.facts.derived import dependencies as derived_dependencies
from attngate.facts.gpus import GPUS
from attngate.facts.modes import LayerKind
from attngate.plan.registry import GATES
from attngate.rules.ruleset import FactValue, RuleSet
from attngate.types import FactType


@dataclass(frozen=True, slots=True)
class Finding:
    """One static finding of the analysis (lint, prove): ``where`` the rule file location, ``message`` what holds,
    ``code`` its kind (``lint.set-conflict``, ``lint.dead-rule``, ``lint.invariant-violated`` ...), ``help`` what to
    do about it, if anything beyond the message."""

    where: str
    message: str
    code: str
    help: str | None = None

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


_LAYER_KIND_FACTS = {
    LayerKind.SLIDING_WINDOW: "has_sliding_window",
    LayerKind.CHUNKED_LOCAL: "is_local_attention_model",
    LayerKind.CROSS_ATTENTION: "has_cross_attention",
}


class Encoder:
    def __init__(self, rules: RuleSet, *, all_gates: bool = False, gate_prefix: str = "", state_prefix: str = ""):
        self.gate_prefix = gate_prefix  # distinct gate variables for a second rule file over the same facts (diff)
        self.state_prefix = state_prefix  # distinct variables of every name: a second state (lint's adjust cycles)
        self.types: dict[str, FactType] = {n: f.type for n, f in FACTS.items()}
        self.types[MODE_FACT.name] = MODE_FACT.type
        self.types[LAYER_FACT.name] = LAYER_FACT.type
        self.types.update({n: g.type for n, g in GATES.items() if all_gates or g.scope == "global"})
        self.vars: dict[str, tuple[Any, Any]] = {}  # name -> (value, is_none)
        self.axioms: list[Any] = []
        self.links: list[Any] = []  # see _link_derived_facts
        self.predicates = {p.name: p.condition.tree.body for p in rules.predicates}
        self._encoded_predicates: dict[str, Any] = {}
        for name in self.types:  # every variable now, so `axioms` is complete before any solver takes it
            self.var(name)
        self._link_gpu_arch()
        self._link_layer_kind()
        self._link_derived_facts()

    def var(self, name: str) -> tuple[Any, Any]:
        if name not in self.vars:
            t = self.types[name]
            make = {"bool": z3.Bool, "int": z3.Int, "float": z3.Real, "str": z3.String}[t.base]
            symbol = self.state_prefix + (self.gate_prefix + name if name in GATES else name)
            value = make(symbol)
            none = z3.Bool(f"{symbol}?none") if t.optional else z3.BoolVal(False)
            if t.choices:
                self.axioms.append(z3.Or(none, *[value == _lit(c) for c in t.choices]))
            if t.minimum is not None:
                self.axioms.append(z3.Or(none, value >= t.minimum))
            if t.maximum is not None:
                self.axioms.append(z3.Or(none, value <= t.maximum))
            self.vars[name] = (value, none)
        return self.vars[name]

    def _link_gpu_arch(self) -> None:
        arch, _ = self.var("gpu_arch")
        major, _ = self.var("sm_major")
        self.axioms.append(z3.Or(*[z3.And(arch == z3.StringVal(a), major == gpu.major) for a, gpu in GPUS.items()]))

    def _link_layer_kind(self) -> None:
        """A layer kind exists only in a model that has it (ModelFacts derives these facts from its layer kinds),
        so a proof over ``layer_kind`` speaks about layers that exist."""
        kind, _ = self.var(LAYER_FACT.name)
        for layer_kind, fact in _LAYER_KIND_FACTS.items():
            has, _ = self.var(fact)
            self.axioms.append(z3.Implies(kind == z3.StringVal(layer_kind.value), has))

    def _link_derived_facts(self) -> None:
        """The derived facts defined as :mod:`attngate.facts.derived` declares them (one definition, read here on z3
        terms): the cheap ones (no arithmetic) in ``axioms``; the rest in ``links``, kept apart because their integer
        division makes queries slower: a query runs without them first (no model then means none with them either)
        and again with them only when it found one, so that a finding's witness is an input that exists (not
        speculative_chain_draft_tokens None beside speculative_num_steps 0)."""
        v = lambda name: self.var(name)[0]  # noqa: E731
        none = lambda name: self.var(name)[1]  # noqa: E731
        terms = _Z3Terms(self)
        own: dict[str, list[Any]] = {}
        for fact in DERIVED_FACTS:
            value, is_none = self.var(fact.name)
            # a None fact's value is read by no condition (each reads it beside its none flag), so its definition
            # may bind it unconditionally: no disjunction for the solver to split on
            own[fact.name] = [_equals(value, _z3(fact.value(terms)))]
            if fact.none_when is not None:
                own[fact.name].append(is_none == _z3(fact.none_when(terms)))
            if fact.axiom:
                self.axioms.extend(own[fact.name])
        #: per derived fact of ``links``, the constraints that define it (with those of the facts it is computed from)
        axioms = {fact.name for fact in DERIVED_FACTS if fact.axiom}
        self.definitions = {
            name: [c for dep in (*deps, name) if dep not in axioms for c in own[dep]]
            for name, deps in derived_dependencies().items()
            if name not in axioms
        }
        q = v("num_attention_heads")
        self.definitions["gqa_group_size"] = [  # ModelFacts' (a model fact, computed from two others)
            q % v("num_key_value_heads") == 0,
            v("gqa_group_size") == q / v("num_key_value_heads"),
        ]
        # what ModelFacts guarantees of the model facts it derives (cheap: no arithmetic)
        model_facts = [
            v("use_mla") == z3.Not(none("kv_lora_rank")),
            z3.Or(z3.Not(v("use_mla")), z3.Not(none("qk_rope_head_dim"))),
            v("has_asymmetric_kv") == z3.Or(v("head_dim") != v("v_head_dim"), v("swa_head_dim") != v("swa_v_head_dim")),
            z3.Implies(v("is_hybrid_swa"), v("has_sliding_window")),
        ]
        self.links = list(dict.fromkeys([*model_facts, *(c for cs in self.definitions.values() for c in cs)]))

    def links_for(self, names: set[str]) -> list[Any]:
        """The links a condition reading ``names`` needs: the definitions of the derived facts among them."""
        return list(dict.fromkeys(c for name in names & self.definitions.keys() for c in self.definitions[name]))

    def encode(self, node: ast.expr) -> Any:
        if isinstance(node, ast.BoolOp):
            parts = [self.encode(v) for v in node.values]
            return z3.And(*parts) if isinstance(node.op, ast.And) else z3.Or(*parts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return z3.Not(self.encode(node.operand))
        if isinstance(node, ast.Constant):
            return z3.BoolVal(bool(node.value))
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = _name(node)
            if name in self.predicates:  # encoded once: predicates are read by many rules
                if name not in self._encoded_predicates:
                    self._encoded_predicates[name] = self.encode(self.predicates[name])
                return self._encoded_predicates[name]
            value, none = self.var(name)
            return z3.And(z3.Not(none), value)
        assert isinstance(node, ast.Compare)
        out, left = [], node.left
        for op, right in zip(node.ops, node.comparators):
            out.append(self.compare(left, op, right))
            left = right
        return z3.And(*out)

    def term(self, name: str, value: Any) -> tuple[Any, Any]:
        """(value, is-None) terms of a value given to ``name``: a literal, None, or a FactValue's fact."""
        if isinstance(value, FactValue):
            return self.var(value.fact)
        if value is None:
            return self.var(name)[0], z3.BoolVal(True)
        return _lit(value), z3.BoolVal(False)

    def equals(self, name: str, literal: Any) -> Any:
        """``name == literal`` with Python's None semantics (``literal`` as :meth:`term` takes it)."""
        value, none = self.var(name)
        other, other_none = self.term(name, literal)
        return z3.Or(z3.And(none, other_none), z3.And(z3.Not(none), z3.Not(other_none), value == other))

    def operand(self, node: ast.expr) -> tuple[Any, Any, bool]:
        if isinstance(node, (ast.Name, ast.Attribute)):
            value, none = self.var(_name(node))
            return value, none, True
        return ast.literal_eval(node), None, False

    def compare(self, left: ast.expr, op: ast.cmpop, right: ast.expr) -> Any:
        lv, ln, lref = self.operand(left)
        rv, rn, rref = self.operand(right)
        if lref and rref:
            eq = z3.Or(z3.And(ln, rn), z3.And(z3.Not(ln), z3.Not(rn), lv == rv))
            if isinstance(op, (ast.Eq, ast.NotEq)):  # (a z3 expression has no truth value: no `or` fallback here)
                return eq if isinstance(op, ast.Eq) else z3.Not(eq)
            return _order(op, lv, rv, z3.And(z3.Not(ln), z3.Not(rn)))
        value, none, literal = (lv, ln, rv) if lref else (rv, rn, lv)
        if isinstance(op, (ast.Is, ast.IsNot)):
            return none if isinstance(op, ast.Is) else z3.Not(none)
        if isinstance(op, (ast.In, ast.NotIn)):
            member = (
                z3.Or(*[none if item is None else z3.And(z3.Not(none), value == _lit(item)) for item in literal])
                if literal
                else z3.BoolVal(False)
            )
            return member if isinstance(op, ast.In) else z3.Not(member)
        if isinstance(op, (ast.Eq, ast.NotEq)):
            eq = z3.And(z3.Not(none), value == _lit(literal))
            return eq if isinstance(op, ast.Eq) else z3.Not(eq)
        a, b = (value, _lit(literal)) if lref else (_lit(literal), value)
        return _order(op, a, b, z3.Not(none))


class _Z3Terms:
    """:class:`attngate.facts.derived.Terms` over the encoder's z3 variables."""

    def __init__(self, enc: Encoder) -> None:
        self.enc = enc

    def __getitem__(self, name: str) -> Any:
        return self.enc.var(name)[0]

    def none(self, name: str) -> Any:
        return self.enc.var(name)[1]

    def if_(self, cond: Any, then: Any, other: Any) -> Any:
        return z3.If(cond, *(_z3(branch() if callable(branch) else branch) for branch in (then, other)))

    def all(self, *conds: Any) -> Any:
        return z3.And(*conds)

    def any(self, *conds: Any) -> Any:
        return z3.Or(*conds)

    def div(self, a: Any, b: Any) -> Any:
        return a / b  # z3's Int "/" floors for positive divisors


def _equals(var: Any, term: Any) -> Any:
    """``var == term``, an if-then-else term turned into a choice between equalities: the same constraint, on which
    z3 decides lint's queries in half the time (its string solver splits an ite term between strings less well)."""
    if z3.is_app_of(term, z3.Z3_OP_ITE):
        cond, then, other = term.children()
        return z3.If(cond, _equals(var, then), _equals(var, other))
    return var == term


def _z3(value: Any) -> Any:
    """A definition's value as a z3 term (a constant branch of a choice is a Python bool or int)."""
    if isinstance(value, bool):
        return z3.BoolVal(value)
    return z3.IntVal(value) if isinstance(value, int) else value


def _order(op: ast.cmpop, a: Any, b: Any, defined: Any) -> Any:
    rel = {ast.Lt: a < b, ast.LtE: a <= b, ast.Gt: a > b, ast.GtE: a >= b}[type(op)]
    return z3.And(defined, rel)


def lit(value: Any) -> Any:
    """A z3 literal of a fact or gate value (not None)."""
    return _lit(value)


def _lit(value: Any) -> Any:
    if isinstance(value, bool):
        return z3.BoolVal(value)
    if isinstance(value, int):
        return z3.IntVal(value)
    if isinstance(value, float):
        return z3.RealVal(value)
    return z3.StringVal(value)


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{node.value.id}.{node.attr}"  # type: ignore[attr-defined]
    return node.id  # type: ignore[attr-defined]


def can_hold(solver: z3.Solver, enc: Encoder, condition: Any, reads: set[str]) -> Verdict:
    """Whether ``condition`` (reading ``reads``) holds for some input (sat), for none (unsat) or z3 cannot tell
    (unknown); the derived-fact links join the query only where the condition reads a derived fact they define
    (few do), and then only that fact's definition. Raises :class:`~attngate.analysis.verdict.Interrupted` on SIGINT."""
    verdict = satisfiable(solver, condition)
    links = enc.links_for(reads)
    if not verdict.sat or not links:
        return verdict
    return satisfiable(solver, condition, *links)


def find(solver: z3.Solver, claim: Any, links: list[Any]) -> tuple[Verdict, z3.ModelRef | None]:
    """(verdict, model) of the solver's assertions and ``claim``, the model one that also satisfies ``links`` (the
    derived-fact definitions, :meth:`Encoder._link_derived_facts`), joined only once the cheaper query without
    them found one; None unless sat. The solver is left unchanged. Raises
    :class:`~attngate.analysis.verdict.Interrupted` on SIGINT."""
    solver.push()
    try:
        solver.add(claim)
        verdict = check(solver)
        if verdict.sat and links:
            solver.add(*links)
            verdict = check(solver)
        return verdict, solver.model() if verdict.sat else None
    finally:
        solver.pop()


def satisfiable(solver: z3.Solver, *terms: Any) -> Verdict:
    """Whether the solver's assertions and ``terms`` have a model (without building it: that costs as much as the
    check), as a three-valued verdict. Raises :class:`~attngate.analysis.verdict.Interrupted` on SIGINT."""
    return check(solver, *terms)
