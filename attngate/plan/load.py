"""Loading a Plan from its JSON text: only whole, only as a resolution wrote it.

A plan's JSON is what every rank of a distributed server compares and what a server trusts, so it loads only when

- it is one JSON object holding every key of the Plan at every depth (every group, every gate, both backends and the
  ``fingerprint``) and no other key: no gate takes its default on load;
- no object holds a key twice (JSON readers differ on which value wins, so one fingerprint would stand for two
  plans);
- every gate's value lies in the gate's domain, the one its ``gate()`` declaration gives (the Python type exactly:
  ``true`` is no int and ``1`` no bool; a ``Literal``'s choices; ``ge``/``le`` bounds), the same domain that refuses
  a rule setting it;
- ``fingerprint`` is 64 lower-case hex digits equal to the sha256 of the plan's canonical JSON.

Every problem is listed at once, each at its JSON path (``$.modes.decode.fa.kv_extent``), in one PlanLoadError.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel, ValidationError

from attngate.errors import AttngateError, PlanLoadError, Problem
from attngate.types import FactType
from attngate.util.inputs import MAX_NESTING, nesting_depth
from attngate.util.suggest import suggestion

#: problems listed before the rest are only counted (a text of a million unknown keys stays a short error)
MAX_PROBLEMS = 100
_SHOWN = 60  # characters of a value or key quoted in a message


@dataclass(frozen=True, slots=True)
class _Fingerprint:
    """The domain of ``fingerprint``: a sha256 hex digest, as ``Plan.fingerprint`` writes it."""

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None

    def describe(self) -> str:
        return "the 64 lower-case hex digits of the sha256 of the plan's canonical JSON"


Shape = dict[str, Union["Shape", FactType, _Fingerprint]]


def shape_of(model: type[BaseModel]) -> Shape:
    """Every key of ``model``'s JSON: a nested group's shape, or a gate's domain (FactType.from_field, as the
    registry derives it from the gate's declaration)."""
    out: Shape = {}
    for name, info in model.model_fields.items():
        kind = info.annotation
        nested = isinstance(kind, type) and issubclass(kind, BaseModel)
        out[name] = shape_of(kind) if nested else FactType.from_field(info)  # type: ignore[arg-type]
    return out


class _Object(dict):
    """A JSON object as ``json.loads`` built it, with the keys it held more than once."""

    __slots__ = ("repeated",)

    def __init__(self, pairs: list[tuple[str, Any]]):
        super().__init__()
        self.repeated: dict[str, None] = {}  # in order of first repetition
        for key, value in pairs:
            if key in self:
                self.repeated[key] = None
            self[key] = value


class _Found:
    """The problems found, the first MAX_PROBLEMS of them in full."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.more = 0

    @property
    def full(self) -> bool:
        return len(self.problems) >= MAX_PROBLEMS

    def add(self, where: str, message: str, code: str, help: str | None = None) -> None:
        """Note one problem of kind ``code`` (counted only, past the first MAX_PROBLEMS)."""
        if self.full:
            self.more += 1
        else:
            self.problems.append(Problem(where, message, code=code, help=help))

    def all(self) -> list[Problem]:
        return self.problems + ([Problem("$", f"and {self.more} more problems", code="more")] if self.more else [])


@functools.cache
def plan_shape(cls: type[BaseModel]) -> Shape:
    """Every key of a plan's JSON, ``fingerprint`` among them."""
    return {**shape_of(cls), "fingerprint": _Fingerprint()}


def load_plan(cls: type[BaseModel], text: str) -> BaseModel:
    """The plan ``text`` holds. Raises PlanLoadError listing every problem: text that is no JSON or nests more than
    MAX_NESTING deep, a key missing, unknown or repeated, a value outside its gate's domain, a fingerprint absent,
    malformed or not the plan's."""
    if nesting_depth(text) > MAX_NESTING:
        raise PlanLoadError(Problem("$", f"nested more than {MAX_NESTING} levels deep", code="plan-load.too-deep"))
    try:
        data = json.loads(text, object_pairs_hook=_Object)
    except json.JSONDecodeError as exc:
        raise PlanLoadError(
            Problem(f"plan:{exc.lineno}:{exc.colno}", f"not JSON: {exc.msg}", code="plan-load.json-syntax")
        ) from None
    except (ValueError, RecursionError) as exc:  # an integer of more digits than Python converts
        raise PlanLoadError(Problem("$", f"not JSON: {exc}", code="plan-load.json-syntax")) from None
    found = _Found()
    _check_object(data, plan_shape(cls), "$", found)
    if found.problems:
        raise PlanLoadError(found.all())
    claimed = data.pop("fingerprint")
    try:
        plan = cls.model_validate(data)
    except (AttngateError, ValidationError, ValueError) as exc:  # the checks above leave none: a second guard
        raise PlanLoadError(Problem("$", f"not a Plan: {exc}", code="plan-load.not-a-plan")) from None
    if claimed != plan.fingerprint:
        raise PlanLoadError(
            Problem(
                "$.fingerprint",
                f"{claimed} does not match the plan's content ({plan.fingerprint}): a gate was changed after the "
                "plan was resolved, or the fingerprint was",
                code="plan-load.fingerprint",
            )
        )
    return plan


def _check_object(value: Any, shape: Shape, path: str, found: _Found) -> None:
    if not isinstance(value, dict):
        found.add(path, f"takes a JSON object (of {', '.join(shape)}), got {_show(value)}", "plan-load.not-object")
        return
    for key in getattr(value, "repeated", ()):
        found.add(
            _at(path, key),
            "appears more than once in one object; a plan's JSON holds each key once (JSON readers differ on "
            "which value wins, so one fingerprint would stand for two plans)",
            "plan-load.repeated-key",
        )
    for key, item in value.items():
        domain = shape.get(key)
        if found.full and not isinstance(domain, dict):  # only counted from here: no message to build
            found.more += domain is None or not domain.accepts(item)
        elif domain is None:
            found.add(_at(path, key), "unknown key", "plan-load.unknown-key", suggestion(key[:_SHOWN], shape))
        elif isinstance(domain, dict):
            _check_object(item, domain, _at(path, key), found)
        elif not domain.accepts(item):
            hint = suggestion(item[:_SHOWN], map(str, domain.choices)) if _has_choices(domain, item) else None
            found.add(_at(path, key), f"takes {domain.describe()}, got {_show(item)}", "plan-load.value-type", hint)
    for key in shape:
        if key not in value:
            found.add(
                _at(path, key),
                "missing; a plan loads only whole, as resolve() wrote it (Plan.to_json): no key takes a default on load",
                "plan-load.missing-key",
            )


def _has_choices(domain: FactType | _Fingerprint, item: Any) -> bool:
    return isinstance(domain, FactType) and domain.choices is not None and isinstance(item, str)


def _at(path: str, key: str) -> str:
    """The JSON path of ``key`` under ``path``: ``$.fa.num_splits``, or ``$["odd key"]`` for a key that is no
    identifier; a long key clipped."""
    if key.isascii() and key.isidentifier():
        return f"{path}.{_clip(key)}"
    return f"{path}[{_clip(json.dumps(key))}]"


def _show(value: Any) -> str:
    """``value`` as its JSON reads, clipped; objects and arrays by kind."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    text = _clip(json.dumps(value))
    return f"the string {text}" if isinstance(value, str) else text


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
