"""Validating a rules file's list sections (``invariants:``, ``deviations:``) entry by entry, with file:line:col."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from attngate.errors import Problem
from attngate.util.suggest import suggestion
from attngate.util.yaml_source import YamlDocument

Spec = TypeVar("Spec", bound=BaseModel)


def pydantic_problems(
    exc: ValidationError, doc: YamlDocument, base: tuple, problems: list[Problem], spec: type[BaseModel]
) -> None:
    """One Problem per error of validating ``spec``; an unknown key gets a did-you-mean from ``spec``'s own keys."""
    for err in exc.errors():
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            name = loc[-1]
            known = [f.alias or n for n, f in spec.model_fields.items()]
            problems.append(
                Problem(
                    doc.where(base + loc),
                    f"unknown key {name!r}",
                    help=suggestion(str(name), known),
                    code="rules.unknown-key",
                )
            )
        else:
            loc = tuple(p for p in loc if not (isinstance(p, str) and p in ("str", "bool")))
            label = ".".join(map(str, loc)) or "rule"
            message = err["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
            problems.append(Problem(doc.where(base + loc), f"{label}: {message}", code="rules.schema"))


def validated_entries(
    raw: Any, doc: YamlDocument, problems: list[Problem], spec: type[Spec], section: str, what: str
) -> Iterator[tuple[tuple, Spec]]:
    """``(path, spec)`` of every entry of the list ``section`` that validates against ``spec``; schema errors and a
    repeated id go to ``problems``. Nothing for a missing section or one that is no list (the file schema says so)."""
    if not isinstance(raw, list):
        return
    seen: dict[str, str] = {}
    for index, item in enumerate(raw):
        path = (section, index)
        try:
            entry = spec.model_validate(item)
        except ValidationError as exc:
            pydantic_problems(exc, doc, path, problems, spec)
            continue
        entry_id = entry.id  # type: ignore[attr-defined]
        if entry_id in seen:
            problems.append(
                Problem(
                    doc.where(path + ("id",)),
                    f"duplicate {what} id {entry_id!r} (first at {seen[entry_id]})",
                    code="rules.duplicate-id",
                )
            )
        seen.setdefault(entry_id, doc.where(path + ("id",)))
        yield path, entry
