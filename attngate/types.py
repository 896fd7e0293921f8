"""The shared vocabulary: the type of a fact or gate, the scopes rules decide in, and the closed sets as enums."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, get_args, get_origin

#: where a gate's value is decided: once per plan, per forward mode, or per layer kind
Scope = Literal["global", "mode", "layer"]


class _Vocabulary(str, Enum):
    """A closed set of strings: each member compares, hashes, prints and serializes as its value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class ViolationKind(_Vocabulary):
    """Why a configuration does not resolve (``Violation.kind``)."""

    FORBID = "forbid"  # a forbid rule matched
    KNOWN_FAILURE = "known_failure"  # a known_failure rule matched and the caller did not opt in
    CONFLICT = "conflict"  # two rules ask one argument or gate for different values
    OSCILLATION = "oscillation"  # adjust rules rewrite in a cycle, or never settle
    OUT_OF_TYPE = "out_of_type"  # an adjust rule's value (read from a fact) leaves the argument's type
    UNRESOLVED = "unresolved"  # no rule decided what the plan needs (a backend, a gate read from an unset fact)
    BAD_ARGUMENT = "bad_argument"  # an argument of resolve() itself (allow_known_failures)


class ViolationSource(_Vocabulary):
    """Who a violation comes from (``Violation.source``); ``Violation.rules`` names the rules where rules do."""

    RULE = "rule"  # one rule: Violation.rule is its id
    RULES = "rules"  # several rules together (a conflict, an oscillation): Violation.rules
    ENGINE = "engine"  # attngate's resolution itself (nothing decided a value it needs)
    ARGUMENT = "argument"  # an argument the caller passed to resolve()


class VerdictStatus(_Vocabulary):
    """A candidate backend's verdict for one configuration (``BackendVerdict.status``)."""

    CHOSEN = "chosen"
    ACCEPTED = "accepted"  # asked for alone, it would resolve
    REJECTED = "rejected"  # asked for alone, rules refuse it or switch away from it


class BatchPath(_Vocabulary):
    """How the FlashInfer backend runs the current batch."""

    NONE = "none"  # IDLE: no tokens
    DECODE = "decode"  # the decode wrappers, over the paged cache
    PAGED = "paged"  # one causal paged pass after writing the new K/V
    RAGGED = "ragged"  # new tokens only (no request has a prefix): the ragged wrapper
    RAGGED_PAGED = "ragged_paged"  # ragged over the new tokens, paged over the prefix, merged with merge_state


Base = Literal["bool", "int", "float", "str"]


@dataclass(frozen=True, slots=True)
class FactType:
    """The type of a fact or gate: a base type, optional choices (an enum), and whether None is allowed."""

    base: Base
    choices: tuple[Any, ...] | None = None
    optional: bool = False
    minimum: float | None = None  # inclusive bounds of an int or float fact (ServerArgs' ge/le; counts are >= 1)
    maximum: float | None = None

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if self.base == "bool":
            ok = isinstance(value, bool)
        elif self.base == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.base == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, str)
        if not ok or (self.choices is not None and value not in self.choices):
            return False
        if self.base in ("int", "float"):
            return (self.minimum is None or value >= self.minimum) and (self.maximum is None or value <= self.maximum)
        return True

    def describe(self) -> str:
        text = f"one of {list(self.choices)}" if self.choices else self.base
        if self.minimum is not None or self.maximum is not None:
            text += f" in [{'-inf' if self.minimum is None else self.minimum}, {'inf' if self.maximum is None else self.maximum}]"
        return f"{text} or None" if self.optional else text

    @classmethod
    def from_annotation(cls, annotation: Any) -> "FactType":
        """FactType of ``bool``, ``int``, ``float``, ``str``, ``Literal[...]`` or ``Optional`` of them."""
        optional = False
        origin = get_origin(annotation)
        if origin in (typing.Union, types.UnionType):
            inner = [a for a in get_args(annotation) if a is not type(None)]
            optional = len(inner) != len(get_args(annotation))
            (annotation,) = inner
            origin = get_origin(annotation)
        if origin is Literal:
            choices = get_args(annotation)
            base: Base = "str" if isinstance(choices[0], str) else "int"
            return cls(base, choices, optional)
        names = {bool: "bool", int: "int", float: "float", str: "str"}
        return cls(names[annotation], None, optional)  # type: ignore[arg-type]

    @classmethod
    def from_field(cls, field: Any) -> "FactType":
        """FactType of a pydantic field, with its ``ge`` / ``le`` bounds."""
        t = cls.from_annotation(field.annotation)
        bounds = {name: getattr(m, name) for m in field.metadata for name in ("ge", "le") if hasattr(m, name)}
        return dataclasses.replace(t, minimum=bounds.get("ge"), maximum=bounds.get("le"))
