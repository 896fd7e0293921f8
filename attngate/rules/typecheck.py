"""The type checker of rule conditions: every name a fact or gate readable in the rule's scope, every comparison
between a fact and a literal of its type (or two facts of one type), ``None`` compared only where a fact may be None
and ordered comparisons only where an earlier conjunct rules None out; every problem with its column."""

from __future__ import annotations

import ast
from dataclasses import replace
from typing import Any

from attngate.errors import ConditionError, ConditionErrors
from attngate.types import FactType
from attngate.util.suggest import suggestion

__all__ = ["ConditionError", "ConditionErrors", "TypeChecker"]  # the two errors live in attngate.errors

_ORDER_OPS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


class TypeChecker:
    """Whitelist and type-check a parsed condition; collects every problem."""

    def __init__(self, facts: dict[str, FactType], gates: dict[str, FactType], hints: dict[str, str]):
        self.facts = facts
        self.hints = hints
        self.gates = gates
        self.errors: list[ConditionError] = []
        self.reads: list[str] = []

    def fail(self, node: ast.AST, message: str, help: str | None = None) -> None:
        self.errors.append(ConditionError(getattr(node, "col_offset", 0), message, help))

    # A boolean expression: what `and`/`or`/`not` combine and what a rule's `when` must be.
    # ``guarded``: optional facts known not to be None where ``node`` is evaluated (Python's
    # short-circuit: after ``x is not None and``, or after ``x is None or``), so an order comparison
    # on an optional fact without its guard is an error here, never a TypeError in resolve().
    def boolean(self, node: ast.expr, guarded: frozenset[str] = frozenset()) -> None:
        if isinstance(node, ast.BoolOp):
            is_and = isinstance(node.op, ast.And)
            for value in node.values:
                self.boolean(value, guarded)
                guarded = guarded | not_none_when(value, is_and)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self.boolean(node.operand, guarded)
        elif isinstance(node, ast.Compare):
            self.compare(node, guarded)
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            pass
        elif isinstance(node, (ast.Name, ast.Attribute)):
            ftype = self.ref(node)
            if ftype is not None and (ftype.base != "bool" or ftype.optional):
                self.fail(node, f"{self.ref_name(node)} is {ftype.describe()}, not a bool; compare it explicitly")
        else:
            self.fail(node, f"{_describe(node)} is not allowed in a condition")

    def ref_name(self, node: ast.expr) -> str:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return f"{node.value.id}.{node.attr}"
        return node.id if isinstance(node, ast.Name) else "?"

    def ref(self, node: ast.expr) -> FactType | None:
        """Type of a fact or gate reference; records the read."""
        if isinstance(node, ast.Attribute):
            if not isinstance(node.value, ast.Name):
                self.fail(node, "only <group>.<gate> attribute references are allowed")
                return None
            name = self.ref_name(node)
            if name not in self.gates:
                if self.gates:
                    self.fail(node, f"unknown gate {name!r}", suggestion(name, self.gates))
                else:
                    self.fail(
                        node, f"unknown gate {name!r} (gate values are readable only by per-mode and per-layer rules)"
                    )
                return None
            self.reads.append(name)
            return self.gates[name]
        assert isinstance(node, ast.Name)
        if node.id not in self.facts:
            scope = self.hints.get(node.id)  # a name this scope cannot read: why, in the message
            self.fail(
                node, f"unknown fact {node.id!r}{scope or ''}", None if scope else suggestion(node.id, self.facts)
            )
            return None
        self.reads.append(node.id)
        return self.facts[node.id]

    def operand(self, node: ast.expr) -> tuple[str, Any]:
        """("ref", FactType|None) for a fact/gate, ("lit", value) for a literal, ("bad", None) otherwise."""
        if isinstance(node, (ast.Name, ast.Attribute)):
            return "ref", self.ref(node)
        try:
            value = ast.literal_eval(node) if _is_literal(node) else _NOT_LITERAL
        except ValueError:
            value = _NOT_LITERAL
        if value is _NOT_LITERAL:
            self.fail(node, f"{_describe(node)} is not allowed in a comparison")
            return "bad", None
        return "lit", value

    def compare(self, node: ast.Compare, guarded: frozenset[str] = frozenset()) -> None:
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            self.pair(node, left, op, right, guarded)
            left = right

    def pair(
        self, node: ast.Compare, left: ast.expr, op: ast.cmpop, right: ast.expr, guarded: frozenset[str] = frozenset()
    ) -> None:
        lk, lv = self.operand(left)
        rk, rv = self.operand(right)
        if "bad" in (lk, rk):
            return
        if lk == "lit" and rk == "lit":
            self.fail(node, "compares two constants")
            return
        if lk == "ref" and rk == "ref":
            if (
                lv is not None
                and rv is not None
                and (lv.base != rv.base or isinstance(op, (ast.In, ast.NotIn, ast.Is, ast.IsNot)))
            ):
                self.fail(
                    node,
                    f"cannot compare {self.ref_name(left)} ({lv.describe()}) with {self.ref_name(right)} ({rv.describe()}) using {_op(op)}",
                )
            elif isinstance(op, _ORDER_OPS):
                for side, ftype in ((left, lv), (right, rv)):
                    if ftype is not None and ftype.optional and self.ref_name(side) not in guarded:
                        self.fail(
                            node,
                            f"{self.ref_name(side)} may be None, and {_op(op)} on None raises; guard it: "
                            f"'{self.ref_name(side)} is not None and ...'",
                        )
            return
        ftype, literal, fnode, lnode = (lv, rv, left, right) if lk == "ref" else (rv, lv, right, left)
        if ftype is None:
            return
        name = self.ref_name(fnode)
        if isinstance(op, (ast.Is, ast.IsNot)):
            if literal is not None:
                self.fail(node, f"'{_op(op)}' is only for None; use == or !=")
            elif not ftype.optional:
                self.fail(node, f"{name} is never None ({ftype.describe()})")
        elif isinstance(op, (ast.In, ast.NotIn)):
            if lk != "ref" or not isinstance(literal, tuple):
                self.fail(node, f"'{_op(op)}' needs a fact on the left and a tuple of literals on the right")
            else:
                for item, item_node in zip(literal, lnode.elts):  # type: ignore[attr-defined]
                    self.literal_fits(item_node, name, ftype, item)
        elif literal is None:
            self.fail(node, f"compare with None using 'is None' / 'is not None', not {_op(op)}")
        elif isinstance(op, _ORDER_OPS) and ftype.base not in ("int", "float"):
            self.fail(node, f"{name} is {ftype.describe()}; {_op(op)} needs a number")
        elif isinstance(op, _ORDER_OPS) and ftype.optional and name not in guarded:
            self.fail(node, f"{name} may be None, and {_op(op)} on None raises; guard it: '{name} is not None and ...'")
        else:  # an order comparison with a number out of range is a tautology, not a type error: bounds only for ==
            self.literal_fits(
                lnode,
                name,
                ftype if not isinstance(op, _ORDER_OPS) else replace(ftype, minimum=None, maximum=None),
                literal,
            )

    def literal_fits(self, node: ast.AST, name: str, ftype: FactType, value: Any) -> None:
        if value is None and ftype.optional:
            return
        if ftype.accepts(value) or (ftype.base == "float" and isinstance(value, int)):
            return
        if ftype.choices and isinstance(value, str):
            choices = f"{len(ftype.choices)} choices" if len(ftype.choices) > 8 else ftype.describe()
            self.fail(
                node, f"{value!r} is not a value of {name} ({choices})", suggestion(value, map(str, ftype.choices))
            )
        else:
            self.fail(node, f"{name} is {ftype.describe()}, compared with {value!r}")


_NOT_LITERAL = object()


def not_none_when(node: ast.expr, outcome: bool) -> frozenset[str]:
    """Names that cannot be None when ``node`` evaluates to ``outcome`` (True after ``and``, False after ``or``)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not_none_when(node.operand, not outcome)
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And) == outcome:  # all parts took that outcome
        return frozenset().union(*(not_none_when(v, outcome) for v in node.values))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.left, (ast.Name, ast.Attribute)):
        op, right = node.ops[0], node.comparators[0]
        is_none = isinstance(right, ast.Constant) and right.value is None
        name = ast.unparse(node.left)
        if is_none and isinstance(op, ast.IsNot if outcome else ast.Is):
            return frozenset({name})
    return frozenset()


def _is_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is None or isinstance(node.value, (bool, int, str))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return isinstance(node.operand, ast.Constant) and type(node.operand.value) is int
    if isinstance(node, ast.Tuple):
        return all(_is_literal(e) and not isinstance(e, ast.Tuple) for e in node.elts)
    return False


def _describe(node: ast.AST) -> str:
    names = {
        ast.Call: "a call",
        ast.Subscript: "a subscript",
        ast.BinOp: "arithmetic",
        ast.Lambda: "a lambda",
        ast.List: "a list (use a tuple)",
        ast.Dict: "a dict",
        ast.Set: "a set (use a tuple)",
        ast.IfExp: "a conditional expression",
        ast.NamedExpr: "an assignment",
    }
    for cls, text in names.items():
        if isinstance(node, cls):
            return text
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r}"
    return f"'{type(node).__name__}'"


def _op(op: ast.cmpop) -> str:
    return {
        ast.Eq: "==",
        ast.NotEq: "!=",
        ast.Lt: "<",
        ast.LtE: "<=",
        ast.Gt: ">",
        ast.GtE: ">=",
        ast.In: "in",
        ast.NotIn: "not in",
        ast.Is: "is",
        ast.IsNot: "is not",
    }[type(op)]
