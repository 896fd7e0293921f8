"""Rule conditions: a safe subset of Python expression syntax, parsed with ``ast``, type-checked, compiled once.

Allowed: ``and``, ``or``, ``not``, comparisons (``== != < <= > >=``, ``in``, ``not in``, ``is None``,
``is not None``), fact names, and literals (int, str, bool, None, tuples of them). Per-mode and
per-layer rules may also read a resolved global gate as ``<group>.<field>`` (``fa.skip_kv_cache``),
so that a table never restates a global decision's condition. Anything else (calls, subscripts,
arithmetic, other attributes) is rejected before compilation, so evaluating a condition can only
read facts.
"""

from __future__ import annotations

import ast
import copy
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attngate.types import FactType

_NO_BUILTINS: dict[str, Any] = {"__builtins__": {}}
_GATE_PREFIX = "__gate__"


def gate_key(name: str) -> str:
    """The name under which a gate's value is visible to compiled conditions."""
    return _GATE_PREFIX + name.replace(".", "__")


class Conjunct:
    """One top-level ``and`` operand: what ``explain`` lists when a candidate rule did not match.

    ``guards``: the earlier operands that keep a fact this one reads from being None (``x is not None and x > 1``);
    it holds only with them, as it is only evaluated after them in the whole condition (on its own, ``x > 1`` would
    raise on None). Compiled on first use: only explanations evaluate conjuncts one by one.
    """

    __slots__ = ("text", "_node", "_guards", "_code", "_whole", "_index")

    def __init__(self, text: str, node: ast.expr | None, guards: tuple[ast.expr, ...] = ()):
        self.text = text
        self._node = node
        self._guards = guards
        self._code: Any = None
        self._whole: Condition | None = None  # node None: it is operand _index of this condition's tree
        self._index = 0

    @property
    def node(self) -> ast.expr:
        if self._node is None:
            self._find()
        return self._node  # type: ignore[return-value]

    @property
    def guards(self) -> tuple[ast.expr, ...]:
        if self._node is None:
            self._find()
        return self._guards

    def _find(self) -> None:
        """A conjunct restored from the disk cache: its node and guards in the condition's tree, parsed again."""
        assert self._whole is not None
        parts = _conjuncts(self._whole.tree.body)
        self._node, self._guards = parts[self._index], _guards(parts[: self._index], parts[self._index])

    def compiled(self) -> Any:
        """The code of this operand under its guards (compiled on first use; attngate.rules.cache stores it)."""
        if self._code is None:
            body = ast.BoolOp(op=ast.And(), values=[*self.guards, self.node]) if self.guards else self.node
            self._code = _compile(ast.Expression(body=ast.fix_missing_locations(body)), "<condition>")
        return self._code

    def holds(self, facts: dict[str, Any]) -> bool:
        return bool(eval(self.compiled(), _NO_BUILTINS, facts))  # noqa: S307 - whitelisted AST, see module doc

    def with_text(self, text: str) -> "Conjunct":
        return Conjunct(text, self.node, self.guards)


@dataclass(frozen=True, slots=True)
class Condition:
    text: str
    code: Any
    conjuncts: tuple[Conjunct, ...]
    reads: tuple[str, ...]  # fact names (and gate names) the condition reads, in first-use order
    _tree: ast.Expression | None = field(default=None, repr=False, compare=False)

    @property
    def tree(self) -> ast.Expression:
        """The condition's syntax tree; parsed again from ``text`` on first use where it was left out (a rule set
        read from the disk cache carries compiled code only: its trees cost more to unpickle than the few that are
        read cost to parse)."""
        if self._tree is None:
            object.__setattr__(self, "_tree", _parse(self.text))
        return self._tree  # type: ignore[return-value]

    def __call__(self, facts: dict[str, Any]) -> bool:
        return bool(eval(self.code, _NO_BUILTINS, facts))  # noqa: S307 - whitelisted AST, see module doc

    def failed(self, facts: dict[str, Any]) -> list[str]:
        """The top-level conjuncts that are false for ``facts``."""
        return [c.text for c in self.conjuncts if not c.holds(facts)]


def restored_condition(
    text: str, code: Any, conjuncts: tuple[tuple[str, Any], ...], reads: tuple[str, ...]
) -> Condition:
    """A condition as attngate.rules.cache stores it: its text, code, reads and each conjunct's (text, code); the
    syntax trees are parsed again from the text where something reads them (lint, a conjunct without code)."""
    parts = []
    for conjunct_text, conjunct_code in conjuncts:
        part = Conjunct(conjunct_text, None)
        part._code = conjunct_code
        parts.append(part)
    condition = Condition(text, code, tuple(parts), reads)
    for index, part in enumerate(parts):
        part._whole, part._index = condition, index
    return condition


def _parse(text: str) -> ast.Expression:
    with warnings.catch_warnings():  # Python's SyntaxWarnings ("invalid decimal literal") are reported as errors
        warnings.simplefilter("ignore")
        return ast.parse(text, mode="eval")


class _GateRefRewriter(ast.NodeTransformer):
    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        assert isinstance(node.value, ast.Name)
        return ast.copy_location(ast.Name(id=gate_key(f"{node.value.id}.{node.attr}"), ctx=ast.Load()), node)


def _compile(tree: ast.Expression, label: str) -> Any:
    if any(isinstance(n, ast.Attribute) for n in ast.walk(tree)):  # the rewrite mutates: keep the original intact
        tree = ast.fix_missing_locations(_GateRefRewriter().visit(copy.deepcopy(tree)))
    return compile(tree, label, "eval")


def compile_condition(
    text: str, facts: dict[str, FactType], gates: dict[str, FactType] | None = None, hints: dict[str, str] | None = None
) -> Condition:
    """Parse, whitelist, type-check and compile ``text``.

    ``facts`` are the readable facts and their types; ``gates`` the readable gates (per-mode and
    per-layer rules only); ``hints`` explain why a known name is unreadable here. Raises
    :class:`ConditionErrors` with every problem.
    """
    # imported here: a rule set read from the disk cache (attngate.rules.cache) is never type-checked again
    from attngate.rules.typecheck import ConditionError, ConditionErrors, TypeChecker

    if not isinstance(text, str) or not text.strip():
        raise ConditionErrors([ConditionError(0, "a condition must be a non-empty expression")])
    if len(text) > MAX_CONDITION_CHARS:
        raise ConditionErrors(
            [ConditionError(0, f"longer than {MAX_CONDITION_CHARS} characters; name parts of it as predicates")]
        )
    try:
        tree = _parse(text.strip())
    except SyntaxError as exc:
        raise ConditionErrors([ConditionError(max((exc.offset or 1) - 1, 0), f"syntax error: {exc.msg}")]) from None
    except (RecursionError, MemoryError):
        raise ConditionErrors([ConditionError(0, f"nested more than {MAX_CONDITION_DEPTH} levels deep")]) from None
    if _depth(tree.body) > MAX_CONDITION_DEPTH:  # the checker, the compiler and z3 all recurse per level
        raise ConditionErrors([ConditionError(0, f"nested more than {MAX_CONDITION_DEPTH} levels deep")])
    checker = TypeChecker(facts, gates or {}, hints or {})
    checker.boolean(tree.body)
    if checker.errors:
        raise ConditionErrors(checker.errors)
    source = text.strip()
    parts = _conjuncts(tree.body)
    conjuncts = tuple(
        Conjunct(ast.get_source_segment(source, p) or ast.unparse(p), p, _guards(parts[:i], p))
        for i, p in enumerate(parts)
    )
    reads = tuple(dict.fromkeys(checker.reads))
    return Condition(source, _compile(tree, "<condition>"), conjuncts, reads, tree)


MAX_CONDITION_CHARS = 4096
MAX_CONDITION_DEPTH = 48


def _depth(root: ast.AST) -> int:
    """The deepest nesting of ``root``'s syntax tree, without recursion."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _guards(earlier: list[ast.expr], part: ast.expr) -> tuple[ast.expr, ...]:
    """The ``earlier`` conjuncts that, true, keep a fact or gate ``part`` reads from being None."""
    from attngate.rules.typecheck import not_none_when

    reads = {ast.unparse(n) for n in ast.walk(part) if isinstance(n, (ast.Name, ast.Attribute))}
    return tuple(e for e in earlier if not_none_when(e, True) & reads)


def _conjuncts(node: ast.expr) -> list[ast.expr]:
    """Top-level ``and`` operands, flattening parenthesised ``and`` groups."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        return [part for value in node.values for part in _conjuncts(value)]
    return [node]
